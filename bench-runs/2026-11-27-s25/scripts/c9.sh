set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 140 ./gpu_v0-sp --test-threads=4 > $R/t-v0-sm90.log 2>&1; echo "v0 test sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
F='ceiling|v0-update-T-kvio-fp8-e4m3/16384$|v0-update-batch-kvio-fp8-e4m3-(seq1024|seq128|chunked1024)/(8|16|32)$|v0-update-page-kvio-fp8-e4m3/(8|16|32)$'
for r in 1 2; do for v in b0 bt sp; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16,32 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 70 ./bench-$v --bench "$F" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt
pk; done; done
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 140 ./gpu_v0-sp --test-threads=4 > $R/t-v0-sm80.log 2>&1; echo "v0 test sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 80 compute-sanitizer --tool memcheck ./gpu_v0-sp gpu_v0_prefill_updates_match_reference > $R/mc-v0.log 2>&1; echo "memcheck rc=$? $SECONDS" >> $R/rc.txt; pk
