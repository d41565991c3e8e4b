set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 110 ./gpu_v0-rr --test-threads=4 > $R/t-v0-sm90.log 2>&1; echo "v0 test sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 110 ./gpu_v0-rr --test-threads=4 > $R/t-v0-sm80.log 2>&1; echo "v0 test sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
F='ceiling|v0-update-T-kvio-fp8-e4m3/16384$|v0-update-batch-kvio-fp8-e4m3-(seq1024|chunked1024)/16$'
for v in sp rr; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/v-$v-1.json timeout 30 ./bench-$v --bench "$F" > $R/v-$v-1.log 2>&1; echo "v $v 1 rc=$? $SECONDS" >> $R/rc.txt; pk
done
