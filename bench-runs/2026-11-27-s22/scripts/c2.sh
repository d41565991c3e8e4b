set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt
(python3 -c "import vllm; print('vllm', vllm.__version__)"; python3 -c "import sgl_kernel; print('sgl_kernel ok')"; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; pip list 2>/dev/null | grep -i -E "vllm|sgl|flashinfer|triton|torch") > $R/py.txt 2>&1
F='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$|fp8-update-T-kvio-e4m3/65536$|slot-update-T-kvio[a-z0-9-]*/65536$'
for r in 1 2; do for v in head ef; do
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update,slot-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/mla-$v-$r.json timeout 90 ./bench-$v --bench "$F" > $R/mla-$v-$r.log 2>&1; echo "mla $v $r rc=$? $SECONDS" >> $R/rc.txt
done; done; pk
KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_PAGES=1,16 KVIO_BENCH_JSON=$R/conc-head.json timeout 220 ./bench-head --bench > $R/conc-head.log 2>&1; echo "conc head rc=$? $SECONDS" >> $R/rc.txt
pk
KVIO_BENCH_GROUPS=pdl KVIO_BENCH_JSON=$R/pdl-head.json timeout 120 ./bench-head --bench > $R/pdl-head.log 2>&1; echo "pdl head rc=$? $SECONDS" >> $R/rc.txt
pk
