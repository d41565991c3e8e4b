set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
if grep -q H200 $R/gpu.txt; then
KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_JSON=$R/conc-new.json timeout 150 ./bench-new --bench > $R/conc-new.log 2>&1; echo "conc new rc=$? $SECONDS" >> $R/rc.txt
pk
F='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/(16384|65536)$|slot-update-T-kvio[a-z0-9-]*/(16384|65536)$|(slot-update|mla-update)-graph-latency-kvio[a-z0-9-]*/(1|16|64|256)$'
KVIO_BENCH_GROUPS=ceiling,mla-update,slot-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/b-new.json timeout 90 ./bench-new --bench "$F" > $R/b-new.log 2>&1; echo "bench new rc=$? $SECONDS" >> $R/rc.txt
else echo "not an H200: nothing run" >> $R/rc.txt; fi
pk
