set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
B='ceiling|v0-update-T-kvio-bf16/(4096|16384|65536)$|v0-update-batch-kvio-bf16-(seq1024|seq128|chunked1024)/(8|16|32)$|v0-update-page-kvio-bf16/(8|16|32)$'
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16,32 KVIO_BENCH_JSON=$R/vb-b0-1.json timeout 70 ./bench-b0 --bench "$B" > $R/vb-b0-1.log 2>&1; echo "vb 1 rc=$? $SECONDS" >> $R/rc.txt; pk
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/(16384|65536)$|fp8-update-T-kvio-e4m3/65536$'
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-b0-1.json timeout 60 ./bench-b0 --bench "$M" > $R/mla-b0-1.log 2>&1; echo "mla 1 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_SPLIT=2,4,1,4 KVIO_BENCH_JSON=$R/conc-b0-1.json timeout 200 ./bench-b0 --bench > $R/conc-b0-1.log 2>&1; echo "conc 1 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-b0-2.json timeout 60 ./bench-b0 --bench "$M" > $R/mla-b0-2.log 2>&1; echo "mla 2 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16,32 KVIO_BENCH_JSON=$R/vb-b0-2.json timeout 70 ./bench-b0 --bench "$B" > $R/vb-b0-2.log 2>&1; echo "vb 2 rc=$? $SECONDS" >> $R/rc.txt; pk
