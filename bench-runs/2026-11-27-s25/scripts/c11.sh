set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__thread_inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
n=0
for v in b0 sp; do for x in 'v0-update-page-kvio-fp8-e4m3/16$' 'v0-update-batch-kvio-fp8-e4m3-seq1024/16$' 'v0-update-batch-kvio-fp8-e4m3-chunked1024/16$'; do
n=$((n+1))
KVIO_BENCH_GROUPS=v0-update KVIO_BENCH_PAGES=16 timeout 60 ncu --kernel-name kvio_update_stream_fp8 --launch-skip 0 --launch-count 1 --metrics $M --csv ./bench-$v --bench "$x" > $R/ncu-$n-$v.csv 2> $R/ncu-$n.err; echo "ncu $n $v $x rc=$? $SECONDS" >> $R/rc.txt; pk
done; done
