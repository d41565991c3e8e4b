set -x
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
grep -q H200 $R/gpu.txt || { echo "not an H200: nothing run" >> $R/rc.txt; pk; exit 0; }
cd gpu-pack && tar xJf t.tar.xz && cd b
F='ceiling|v0-update-T-kvio-(bf16|fp8-e4m3)/(4096|16384|65536)$|v0-update-batch-kvio-(bf16|fp8-e4m3)-(seq1024|seq128|chunked1024)/(8|16)$|v0-update-page-kvio-(bf16|fp8-e4m3)/(8|16)$'
for r in 1 2; do for v in base p; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 80 ./bench-$v --bench "$F" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt
done; pk; done
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/(16384|65536)$|fp8-update-T-kvio-e4m3/65536$'
for r in 1 2; do
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-p-$r.json timeout 60 ./bench-p --bench "$M" > $R/mla-p-$r.log 2>&1; echo "mla $r rc=$? $SECONDS" >> $R/rc.txt
done; pk
KVIO_BENCH_GROUPS=ceiling,concurrent KVIO_BENCH_SPLIT=1,4,2,4 KVIO_BENCH_JSON=$R/conc-p.json timeout 200 ./bench-p --bench > $R/conc-p.log 2>&1; echo "conc rc=$? $SECONDS" >> $R/rc.txt; pk
