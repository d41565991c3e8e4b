set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
M='ceiling|mla-update-(T|prefill)-kvio-bf16/(16384|65536)$'
for r in 1 2; do
for v in s1 c1 c2; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-$r.json timeout 50 ./bench-$v --bench "$M" > $R/m-$v-$r.log 2>&1; echo "m $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
done
