set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 170 ./gpu_fp8-final > $R/t-fp8-sm90.log 2>&1; echo "fp8 test sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 170 ./gpu_fp8-final > $R/t-fp8-sm80.log 2>&1; echo "fp8 test sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
