set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
H200=0; grep -q H200 $R/gpu.txt && H200=1
V='ceiling|v0-update-T-kvio-(fp8-e4m3|bf16)/16384$|v0-update-batch-kvio-(fp8-e4m3|bf16)-(seq1024|chunked1024)/16$|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$|fp8-update-T-kvio-e4m3/65536$'
for r in 1 2; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-m0-$r.json timeout 60 ./bench-m0 --bench "$V" > $R/v-m0-$r.log 2>&1; echo "v $r rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-m0-$r.json timeout 50 ./bench-m0 --bench "$M" > $R/m-m0-$r.log 2>&1; echo "m $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 170 ./gpu_mla-m0 --test-threads=4 > $R/t-mla-sm80.log 2>&1; echo "mla sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-m0 --test-threads=4 gpu > $R/t-v0-sm90.log 2>&1; echo "v0 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
if [ $H200 = 1 ]; then
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 60 ./gpu_mla-m0 --test-threads=4 gpu > $R/t-mla-sm90.log 2>&1; echo "mla sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-m0 --test-threads=4 gpu > $R/t-v0-sm80.log 2>&1; echo "v0 sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
fi
