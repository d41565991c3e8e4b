set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_write.sum,smsp__inst_executed_op_global_st.sum,smsp__inst_executed_op_global_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex_op_write_lookup_miss.sum,lts__t_sectors_srcunit_tex_op_write_lookup_hit.sum
n=0
for row in 'v0-update-page-kvio-fp8-e4m3/16$' 'v0-update-batch-kvio-fp8-e4m3-seq1024/16$' 'v0-update-page-kvio-bf16/16$' 'v0-update-batch-kvio-bf16-seq1024/16$'; do
n=$((n+1))
KVIO_BENCH_GROUPS=v0-update KVIO_BENCH_PAGES=16 timeout 100 ncu --kernel-name regex:kvio_update_stream --launch-skip 4 --launch-count 1 --metrics $M --csv ./bench-m --bench "$row" > $R/ncu-$n.csv 2> $R/ncu-$n.err; echo "ncu $n $row rc=$? $SECONDS" >> $R/rc.txt; pk
done
F='ceiling|v0-update-batch-kvio-fp8-e4m3-(seq1024|seq128|chunked1024)/64$|v0-update-page-kvio-fp8-e4m3/64$'
for r in 1 2; do for v in m f; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=64 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 60 ./bench-$v --bench "$F" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt
pk; done; done
