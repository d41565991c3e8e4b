set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
F='ceiling|v0-update-T-kvio-(fp8-e4m3|bf16)/16384$|v0-update-batch-kvio-(fp8-e4m3|bf16)-(seq1024|seq128|chunked1024)/16$|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$'
M='ceiling|mla-update-T-kvio[a-z0-9-]*/65536$|fp8-update-T-kvio-e4m3/65536$'
for v in rr n2 n3; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-1.json timeout 60 ./bench-$v --bench "$F" > $R/v-$v-1.log 2>&1; echo "v $v 1 rc=$? $SECONDS" >> $R/rc.txt; pk
done
for v in rr n3; do
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-1.json timeout 50 ./bench-$v --bench "$M" > $R/m-$v-1.log 2>&1; echo "m $v 1 rc=$? $SECONDS" >> $R/rc.txt; pk
done
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-n3 --test-threads=4 gpu > $R/t-v0-sm90.log 2>&1; echo "v0 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-n3 --test-threads=4 gpu > $R/t-v0-sm80.log 2>&1; echo "v0 sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 ./gpu_v0-n3 gpu_v0_prefill_updates_match_reference > $R/mc-v0.log 2>&1; echo "memcheck v0 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=v0-update KVIO_BENCH_PAGES=16 timeout 60 ncu --kernel-name kvio_update_stream --launch-skip 0 --launch-count 1 --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv ./bench-n3 --bench 'v0-update-page-kvio-bf16/16$' > $R/ncu-n3.csv 2> $R/ncu-n3.err; echo "ncu rc=$? $SECONDS" >> $R/rc.txt; pk
for v in rr n2 n3; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-2.json timeout 60 ./bench-$v --bench "$F" > $R/v-$v-2.log 2>&1; echo "v $v 2 rc=$? $SECONDS" >> $R/rc.txt; pk
done
