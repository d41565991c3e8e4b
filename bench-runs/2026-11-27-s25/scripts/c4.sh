set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
n=0
for x in 'kvio_update_stream_fp8 v0-update-page-kvio-fp8-e4m3/16$' 'kvio_update_stream_fp8 v0-update-batch-kvio-fp8-e4m3-seq1024/16$' 'kvio_update_stream v0-update-page-kvio-bf16/16$'; do
set -- $x; n=$((n+1))
KVIO_BENCH_GROUPS=v0-update KVIO_BENCH_PAGES=16 timeout 120 ncu --kernel-name $1 --launch-skip 0 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum --csv --page details ./bench-b0 --bench "$2" > $R/ncu-$n.csv 2> $R/ncu-$n.err; echo "ncu $n $2 rc=$? $SECONDS" >> $R/rc.txt; pk
done
