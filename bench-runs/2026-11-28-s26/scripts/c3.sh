set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-n2 --test-threads=4 gpu > $R/t-v0-sm90.log 2>&1; echo "v0 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
F='ceiling|v0-update-T-kvio-(fp8-e4m3|bf16)/16384$|v0-update-batch-kvio-(fp8-e4m3|bf16)-(seq1024|seq128|chunked1024)/16$|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$'
for r in 1 2; do for v in rr n1 n2; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 60 ./bench-$v --bench "$F" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done; done
n=0
for x in 'kvio_update_stream_fp8 v0-update-page-kvio-fp8-e4m3/16$' 'kvio_update_stream v0-update-page-kvio-bf16/16$' 'kvio_update_stream_fp8 v0-update-batch-kvio-fp8-e4m3-seq1024/16$'; do
set -- $x; n=$((n+1))
KVIO_BENCH_GROUPS=v0-update KVIO_BENCH_PAGES=16 timeout 100 ncu --kernel-name $1 --launch-skip 0 --launch-count 1 --section SourceCounters --metrics gpu__time_duration.sum,smsp__inst_executed.sum --page source --print-source sass --csv ./bench-n2 --bench "$2" > $R/src-$n.csv 2> $R/src-$n.err; echo "src $n $1 rc=$? $SECONDS" >> $R/rc.txt; pk
done
