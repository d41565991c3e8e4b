set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt
F='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/(16384|65536)$|fp8-update-T-kvio-e4m3/65536$'
for r in 1 2; do for v in base head; do
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-$v-$r.json timeout 90 ./bench-$v --bench "$F" > $R/mla-$v-$r.log 2>&1; echo "mla $v $r rc=$? $SECONDS" >> $R/rc.txt
done; done; pk
F='ceiling|(offload|onload)-(layer-separate|cross-layer|convert-lf-pf)-kvio-kernel/(1|16|128)$'
for v in base head; do
KVIO_BENCH_GROUPS=ceiling,offload,onload KVIO_BENCH_PAGES=1,16,128 KVIO_BENCH_JSON=$R/xfer-$v.json timeout 100 ./bench-$v --bench "$F" > $R/xfer-$v.log 2>&1; echo "xfer $v rc=$? $SECONDS" >> $R/rc.txt
done; pk
F='ceiling|(slot-update|mla-update|v0-update)-graph-latency-kvio[a-z0-9-]*/(1|16|64|256)$'
for v in base head; do
KVIO_BENCH_GROUPS=ceiling,slot-update,mla-update,v0-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/lat-$v.json timeout 80 ./bench-$v --bench "$F" > $R/lat-$v.log 2>&1; echo "lat $v rc=$? $SECONDS" >> $R/rc.txt
done; pk
KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_PAGES=1,16 KVIO_BENCH_JSON=$R/conc-head.json timeout 150 ./bench-head > $R/conc-head.log 2>&1; echo "conc head rc=$? $SECONDS" >> $R/rc.txt
pk
