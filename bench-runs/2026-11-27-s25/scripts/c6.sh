set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
n=0
for x in 'regex:kvio_update_rows mla-update-T-kvio-bf16/65536$' 'regex:kvio_update_rows mla-update-prefill-kvio-bf16/65536$' 'regex:kvio_update_rows mla-update-T-kvio-fp8-e4m3/65536$'; do
set -- $x; n=$((n+1))
KVIO_BENCH_GROUPS=mla-update timeout 100 ncu --kernel-name $1 --launch-skip 0 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum --csv --page details ./bench-b0 --bench "$2" > $R/ncu-$n.csv 2> $R/ncu-$n.err; echo "ncu $n $2 rc=$? $SECONDS" >> $R/rc.txt; pk
done
