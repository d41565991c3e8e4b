set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_JSON=$R/conc-new.json timeout 150 ./bench-new --bench > $R/conc-new.log 2>&1; echo "conc new rc=$? $SECONDS" >> $R/rc.txt
pk
