set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
export KVIO_BENCH_VLLM_CUBIN=$PWD/vk.cubin
S='ceiling|slot-update-T-(kvio|vllm)/(16|256|65536)$|slot-update-page-(kvio|vllm)/16$|slot-update-graph-latency'
F='ceiling|fp8-update-T-(kvio|vllm)-e4m3/(16384|65536)$|fp8-update-graph-latency'
M='ceiling|mla-update-T-(kvio|vllm)-(bf16|fp8-e4m3)/(16384|65536)$|mla-update-graph-latency'
V='ceiling|v0-update-T-(kvio|vllm)-(bf16|fp8-e4m3)/(256|16384)$|v0-update-batch-(kvio|vllm)-(bf16|fp8-e4m3)-seq1024/16$|v0-update-graph-latency'
for r in 1 2; do
for x in s:slot-update:$S f:fp8-update:$F m:mla-update:$M v:v0-update:$V; do
IFS=: read n grp filt <<< "$x"
KVIO_BENCH_GROUPS=ceiling,$grp KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/$n-$r.json timeout 100 ./bench-p1 --bench "$filt" > $R/$n-$r.log 2>&1; echo "$n $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
done
