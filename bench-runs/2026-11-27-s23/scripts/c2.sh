set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 170 ./gpu_v0-b --test-threads=4 > $R/t-v0-sm90.log 2>&1; echo "v0 test sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
F='ceiling|v0-update-T-kvio-fp8-e4m3/(4096|16384|65536)$|v0-update-batch-kvio-fp8-e4m3-(seq1024|seq128|chunked1024)/(8|16)$|v0-update-page-kvio-fp8-e4m3/(8|16)$'
for r in 1 2; do for v in base a b; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/f-$v-$r.json timeout 60 ./bench-$v --bench "$F" > $R/f-$v-$r.log 2>&1; echo "fp8 $v $r rc=$? $SECONDS" >> $R/rc.txt
done; done; pk
KVIO_BENCH_GROUPS=ceiling,pdl KVIO_BENCH_JSON=$R/pdl-b-2.json timeout 60 ./bench-b --bench 'ceiling|pdl' > $R/pdl-b-2.log 2>&1; echo "pdl rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 150 ./gpu_v0-b --test-threads=4 > $R/t-v0-sm80.log 2>&1; echo "v0 test sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 compute-sanitizer --tool memcheck ./gpu_v0-b gpu_v0_prefill_updates_match_reference > $R/mc-v0.log 2>&1; echo "memcheck rc=$? $SECONDS" >> $R/rc.txt; pk
