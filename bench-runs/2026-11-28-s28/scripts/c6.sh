set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$|v0-update-batch-kvio-(fp8-e4m3|bf16)-(seq1024|chunked1024)/16$|v0-update-batch-kvio-bf16-seq1024/8$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$|fp8-update-T-kvio-e4m3/65536$'
for v in u1 s5; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v.json timeout 60 ./bench-$v --bench "$V" > $R/v-$v.log 2>&1; echo "v $v rc=$? $SECONDS" >> $R/rc.txt; pk
done
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-s5.json timeout 50 ./bench-s5 --bench "$M" > $R/m-s5.log 2>&1; echo "m s5 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 110 ./gpu_v0-s5 --test-threads=4 gpu > $R/t-v0-s5-sm90.log 2>&1; echo "v0 s5 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
