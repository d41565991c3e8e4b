set -x
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
grep -q H200 $R/gpu.txt || { echo "not an H200: nothing run" >> $R/rc.txt; pk; exit 0; }
cd gpu-pack && tar xJf t.tar.xz && cd b
F='ceiling|v0-update-T-kvio-fp8-e4m3/16384$|v0-update-batch-kvio-fp8-e4m3-(seq1024|seq128|chunked1024)/(8|16|32)$|v0-update-page-kvio-fp8-e4m3/(8|16|32)$'
for r in 1 2; do for v in b0 sp; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16,32 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 70 ./bench-$v --bench "$F" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt
pk; done; done
