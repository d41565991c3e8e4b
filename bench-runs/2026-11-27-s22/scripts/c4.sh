set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
F='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$'
for r in 1 2; do for v in head r2 r3; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-$v-$r.json timeout 90 ./bench-$v --bench "$F" > $R/mla-$v-$r.log 2>&1; echo "mla $v $r rc=$? $SECONDS" >> $R/rc.txt
done; done; pk
for s in 1_4 2_4 1_3 1_5 2_3 1_4; do
KVIO_BENCH_SPLIT=${s/_/,} KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_PAGES=1,16 KVIO_BENCH_JSON=$R/conc-$s-$SECONDS.json timeout 100 ./bench-head --bench > $R/conc-$s-$SECONDS.log 2>&1; echo "conc $s rc=$? $SECONDS" >> $R/rc.txt
pk
done
