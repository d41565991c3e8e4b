set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
END=300
rt() { t=$1; a=$2; n=$3; shift 3; left=$((END-SECONDS)); [ $left -lt 20 ] && { echo "$t $a skipped $SECONDS" >> $R/rc.txt; return; }
  KVIO_TEST_ARCH=$a KVIO_REQUIRE_GPU=1 timeout $left ./$t --test-threads=$n "$@" > $R/t-$t-$a.log 2>&1; echo "$t $a rc=$? $SECONDS" >> $R/rc.txt; pk; }
for t in gpu_v0 gpu_write gpu_blocks gpu_mla gpu_streams; do rt $t sm80 4; done
pk
