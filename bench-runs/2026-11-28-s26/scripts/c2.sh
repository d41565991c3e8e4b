set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
n=0
for x in 'kvio_update_stream_fp8 v0-update-page-kvio-fp8-e4m3/16$' 'kvio_update_stream v0-update-page-kvio-bf16/16$' 'kvio_update_rows mla-update-T-kvio-bf16/65536$'; do
set -- $x; n=$((n+1))
KVIO_BENCH_GROUPS=v0-update,mla-update KVIO_BENCH_PAGES=16 timeout 100 ncu --kernel-name $1 --launch-skip 0 --launch-count 1 --section SourceCounters --metrics gpu__time_duration.sum,smsp__inst_executed.sum --page source --print-source sass --csv ./bench-n1 --bench "$2" > $R/src-$n.csv 2> $R/src-$n.err; echo "src $n $1 rc=$? $SECONDS" >> $R/rc.txt; pk
done
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-n1 --test-threads=4 gpu > $R/t-v0-sm80.log 2>&1; echo "v0 sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 60 ./gpu_mla-n1 --test-threads=4 gpu > $R/t-mla-sm80.log 2>&1; echo "mla sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 100 ./gpu_fp8-n1 --test-threads=4 gpu_quantized > $R/t-fp8-sm80.log 2>&1; echo "fp8 sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 ./gpu_v0-n1 gpu_v0_prefill_updates_match_reference > $R/mc-v0.log 2>&1; echo "memcheck v0 rc=$? $SECONDS" >> $R/rc.txt; pk
