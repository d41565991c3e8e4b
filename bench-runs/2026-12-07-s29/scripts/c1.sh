set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$|v0-update-batch-kvio-(fp8-e4m3|bf16)-(seq1024|chunked1024)/(8|16)$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$'
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-m1 --test-threads=4 gpu > $R/t-v0-m1-sm90.log 2>&1; echo "v0 m1 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
for r in 1 2; do
for v in m1 s5; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 80 ./bench-$v --bench "$V" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
for v in m1 pc; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-$r.json timeout 50 ./bench-$v --bench "$M" > $R/m-$v-$r.log 2>&1; echo "m $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
done
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./gpu_v0-m1 gpu_v0_prefill_updates_match_reference > $R/mc-v0.log 2>&1; echo "memcheck v0 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 200 ./gpu_v0-m1 --test-threads=4 gpu > $R/t-v0-m1-sm80.log 2>&1; echo "v0 m1 sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
