set -x
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
grep -q H200 $R/gpu.txt || { echo "not an H200: nothing run" >> $R/rc.txt; pk; exit 0; }
cd gpu-pack && tar xJf t.tar.xz && cd b
F='ceiling|v0-update-T-kvio-(bf16|fp8-e4m3)/16384$|v0-update-batch-kvio-(bf16|fp8-e4m3)-(seq1024|seq128|chunked1024)/(16|32)$|v0-update-page-kvio-(bf16|fp8-e4m3)/(8|16|32)$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/(16384|65536)$|fp8-update-T-kvio-e4m3/65536$'
G='ceiling|v0-update-batch-kvio-fp8-e4m3-(seq1024|seq128|chunked1024)/32$|v0-update-page-kvio-fp8-e4m3/32$'
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16,32 KVIO_BENCH_JSON=$R/v-fin-1.json timeout 70 ./bench-fin --bench "$F" > $R/v-fin-1.log 2>&1; echo "v fin 1 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=32 KVIO_BENCH_JSON=$R/v-m-1.json timeout 40 ./bench-m --bench "$G" > $R/v-m-1.log 2>&1; echo "v m 1 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-fin-1.json timeout 45 ./bench-fin --bench "$M" > $R/mla-fin-1.log 2>&1; echo "mla 1 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16,32 KVIO_BENCH_JSON=$R/v-fin-2.json timeout 70 ./bench-fin --bench "$F" > $R/v-fin-2.log 2>&1; echo "v fin 2 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-fin-2.json timeout 45 ./bench-fin --bench "$M" > $R/mla-fin-2.log 2>&1; echo "mla 2 rc=$? $SECONDS" >> $R/rc.txt; pk
