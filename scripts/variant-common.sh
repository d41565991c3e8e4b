# What every call script of a run folder starts with (`source gpu-pack/common.sh`, from the
# repository root on the GPU machine; `scripts/variant pack` puts it there): the pack unpacked
# once into gpu-pack/b (the working folder), results in $OUT/r (r.tgz rewritten by pk after
# each step), the GPU's name, and rt to run one test executable with a time limit that ends
# before the call's (END, seconds since the call began).
set -x
cd gpu-pack && { [ -d b ] || tar xJf t.tar.xz; } && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
END=575
rt() { # rt EXE ARCH THREADS [args]
  t=$1; a=$2; n=$3; shift 3; left=$((END-SECONDS)); [ $left -lt 20 ] && { echo "$t $a skipped $SECONDS" >> $R/rc.txt; return; }
  KVIO_TEST_ARCH=$a KVIO_REQUIRE_GPU=1 timeout $left ./$t --test-threads=$n "$@" > $R/t-$t-$a.log 2>&1; echo "$t $a rc=$? $SECONDS" >> $R/rc.txt; pk; }
