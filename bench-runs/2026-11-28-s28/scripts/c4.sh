set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16|32)$|v0-update-batch-kvio-(fp8-e4m3|bf16)-(seq1024|seq128|chunked1024)/(8|16)$'
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-s2 --test-threads=4 gpu > $R/t-v0-s2-sm90.log 2>&1; echo "v0 s2 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
for r in 1 2; do
for v in p2 u1 s2; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16,32 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 80 ./bench-$v --bench "$V" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
done
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-u1 --test-threads=4 gpu > $R/t-v0-u1-sm90.log 2>&1; echo "v0 u1 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
