set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
F='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$|fp8-update-T-kvio-e4m3/65536$|slot-update-T-kvio[a-z0-9-]*/65536$'
for r in 1 2; do for v in head ef cs; do
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update,slot-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-$v-$r.json timeout 90 ./bench-$v --bench "$F" > $R/mla-$v-$r.log 2>&1; echo "mla $v $r rc=$? $SECONDS" >> $R/rc.txt
done; done; pk
for s in 1,5 1,4 1,3 3,3; do
KVIO_BENCH_SPLIT=$s KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_PAGES=1,16 KVIO_BENCH_JSON=$R/conc-$s.json timeout 100 ./bench-head --bench > $R/conc-$s.log 2>&1; echo "conc $s rc=$? $SECONDS" >> $R/rc.txt
pk
done
