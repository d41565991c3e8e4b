set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_write.sum,smsp__inst_executed_op_global_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__lsu_writeback_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
n=0
for x in '4 v0-update-page-kvio-fp8-e4m3/16$' '5 v0-update-batch-kvio-fp8-e4m3-seq1024/16$' '7 v0-update-batch-kvio-fp8-e4m3-chunked1024/16$'; do
set -- $x; n=$((n+1))
KVIO_BENCH_GROUPS=v0-update KVIO_BENCH_PAGES=16 timeout 100 ncu --kernel-name kvio_update_stream_fp8 --launch-skip $1 --launch-count 1 --metrics $M --csv ./bench-m --bench "$2" > $R/ncu-$n.csv 2> $R/ncu-$n.err; echo "ncu $n $2 rc=$? $SECONDS" >> $R/rc.txt; pk
done
