# c2.sh (session 33, for the next GPU session; the same pack as c1, plus bench-base): main's remaining GPU tests on
# sm_90 (gpu_streams, gpu_graph_step, gpu_pdl, gpu_leaks, gpu_concurrent, gpu_stress,
# gpu_slice_layouts), the host time per call (group host) of main against base (c888778,
# before 194d4e2's cheaper planning), two rounds, then main's transfer rows (offload and
# onload on the kernel, pages 1, 16, 128, both layouts) and the decode latencies in a graph
# (NHD, MLA, v0).
source gpu-pack/common.sh
X='ceiling|(offload|onload)-(layer-separate|cross-layer|convert-lf-pf)-kvio-kernel/(1|16|128)$'
G='ceiling|(slot-update|mla-update|v0-update)-graph-latency-kvio[a-z0-9-]*/(1|16|64|256)$'
for v in main base; do (KVIO_BENCH_GROUPS=none timeout 300 ./bench-$v --bench '^$' > $R/jit-$v.log 2>&1; echo "jit $v rc=$? $SECONDS" >> $R/rc.txt) & done
for t in gpu_streams gpu_graph_step gpu_pdl gpu_leaks gpu_concurrent gpu_stress; do rt $t-main sm90 4; done
wait
hs="main base"
for r in 1 2; do for v in $hs; do
KVIO_BENCH_GROUPS=host KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/h-$v-$r.json timeout 90 ./bench-$v > $R/h-$v-$r.log 2>&1; echo "h $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done; hs="base main"; done
KVIO_BENCH_GROUPS=ceiling,offload,onload KVIO_BENCH_PAGES=1,16,128 KVIO_BENCH_JSON=$R/x-main.json timeout 100 ./bench-main --bench "$X" > $R/x-main.log 2>&1; echo "x main rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,slot-update,mla-update,v0-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/g-main.json timeout 80 ./bench-main --bench "$G" > $R/g-main.log 2>&1; echo "g main rc=$? $SECONDS" >> $R/rc.txt; pk
rt gpu_slice_layouts-main sm90 4
pk
