set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_BENCH_GROUPS=ceiling,pdl KVIO_BENCH_JSON=$R/pdl-b0-1.json timeout 120 ./bench-b0 --bench > $R/pdl-b0-1.log 2>&1; echo "pdl 1 rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_BENCH_GROUPS=ceiling,host KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/host-b0-1.json timeout 150 ./bench-b0 --bench > $R/host-b0-1.log 2>&1; echo "host 1 rc=$? $SECONDS" >> $R/rc.txt; pk
