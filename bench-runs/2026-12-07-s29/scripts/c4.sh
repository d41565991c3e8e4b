set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$|v0-update-batch-kvio-bf16-(seq1024|chunked1024)/(8|16)$'
for v in m2 r2; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-1.json timeout 50 ./bench-$v --bench "$V" > $R/v-$v-1.log 2>&1; echo "v $v 1 rc=$? $SECONDS" >> $R/rc.txt; pk
done
if grep -q H200 $R/gpu.txt; then
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$'
for v in r2 pc; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-1.json timeout 30 ./bench-$v --bench "$M" > $R/m-$v-1.log 2>&1; echo "m $v 1 rc=$? $SECONDS" >> $R/rc.txt; pk
done
fi
