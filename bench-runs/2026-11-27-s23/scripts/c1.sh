set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 170 ./gpu_v0-new --test-threads=4 > $R/t-v0-sm90.log 2>&1; echo "v0 test sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
F='ceiling|v0-update-T-kvio-(bf16|fp8-e4m3)/(4096|16384|65536)$|v0-update-batch-kvio-(bf16|fp8-e4m3)-(seq1024|seq128|chunked1024)/16$|v0-update-page-kvio-fp8-e4m3/8$'
for v in base new; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v0-$v-1.json timeout 100 ./bench-$v --bench "$F" > $R/v0-$v-1.log 2>&1; echo "v0 $v rc=$? $SECONDS" >> $R/rc.txt; pk
done
KVIO_BENCH_GROUPS=ceiling,pdl KVIO_BENCH_JSON=$R/pdl-new-1.json timeout 80 ./bench-new --bench 'ceiling|pdl' > $R/pdl-new-1.log 2>&1; echo "pdl rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 170 ./gpu_v0-new --test-threads=4 > $R/t-v0-sm80.log 2>&1; echo "v0 test sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
