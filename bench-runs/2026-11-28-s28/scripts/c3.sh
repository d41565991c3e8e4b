set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
export KVIO_BENCH_VLLM_CUBIN=$PWD/vk.cubin
M='ceiling|mla-update-(T|prefill)-kvio-fp8-e4m3/(16384|65536)$|mla-update-graph-latency-(kvio|vllm)-fp8'
for r in 1 2; do
for v in p1 p2; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_JSON=$R/m-$v-$r.json timeout 60 ./bench-$v --bench "$M" > $R/m-$v-$r.log 2>&1; echo "m $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
done
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 90 ./gpu_mla-p2 --test-threads=4 > $R/t-mla-sm90.log 2>&1; echo "mla sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 170 ./gpu_mla-p2 --test-threads=4 gpu > $R/t-mla-sm80.log 2>&1; echo "mla sm80 rc=$? $SECONDS" >> $R/rc.txt; pk
