set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
END=570
rt() { # rt TEST ARCH THREADS [args]
  t=$1; a=$2; n=$3; shift 3; left=$((END-SECONDS)); [ $left -lt 20 ] && { echo "$t $a skipped $SECONDS" >> $R/rc.txt; return; }
  KVIO_TEST_ARCH=$a KVIO_REQUIRE_GPU=1 timeout $left ./$t --test-threads=$n "$@" > $R/t-$t-$a.log 2>&1; echo "$t $a rc=$? $SECONDS" >> $R/rc.txt; pk; }
if grep -q H200 $R/gpu.txt; then
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$|v0-update-batch-kvio-bf16-(seq1024|chunked1024)/(8|16)$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$'
for r in 1 2; do for v in m2 main; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 50 ./bench-$v --bench "$V" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done; done
for r in 1 2; do for v in pc main; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-$r.json timeout 30 ./bench-$v --bench "$M" > $R/m-$v-$r.log 2>&1; echo "m $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done; done
fi
for t in gpu_v0 gpu_write gpu_blocks gpu_mla gpu_fp8; do rt $t sm90 4; done
for t in gpu_streams gpu_cudarc gpu_graph_step gpu_pdl gpu_leaks gpu_concurrent gpu_baselines; do rt $t sm90 1; done
KVIO_REQUIRE_GPU=1 timeout 30 ./serving_step > $R/t-serving_step.log 2>&1; echo "serving_step rc=$? $SECONDS" >> $R/rc.txt
rt gpu_stress sm90 1
rt gpu_slice_layouts sm90 4
pk
