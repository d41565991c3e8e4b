set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 200 ./gpu_fp8-d1 --test-threads=4 --skip emulated > $R/t-fp8-sm90.log 2>&1; echo "fp8 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 60 ./gpu_fp8-d1 --test-threads=4 gpu_quantized > $R/t-fp8-sm80.log 2>&1; echo "fp8 sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-d1 --test-threads=4 gpu > $R/t-v0-sm90.log 2>&1; echo "v0 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-d1 --test-threads=4 gpu > $R/t-v0-sm80.log 2>&1; echo "v0 sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 90 ./gpu_write-d1 --test-threads=4 > $R/t-write-sm90.log 2>&1; echo "write sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
MET=gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_requests_srcunit_tex_op_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
n=0
for x in 'kvio_update_stream v0-update-page-kvio-bf16/16$' 'kvio_update_stream v0-update-batch-kvio-bf16-seq1024/16$' 'kvio_update_stream v0-update-batch-kvio-bf16-chunked1024/16$' 'kvio_update_stream_fp8 v0-update-page-kvio-fp8-e4m3/16$' 'kvio_update_stream_fp8 v0-update-batch-kvio-fp8-e4m3-seq1024/16$'; do
set -- $x; n=$((n+1))
KVIO_BENCH_GROUPS=v0-update KVIO_BENCH_PAGES=16 timeout 60 ncu --kernel-name $1 --launch-skip 2 --launch-count 1 --metrics $MET --csv ./bench-d1 --bench "$2" > $R/ncu-$n.csv 2> $R/ncu-$n.err; echo "ncu $n $1 $2 rc=$? $SECONDS" >> $R/rc.txt; pk
done
