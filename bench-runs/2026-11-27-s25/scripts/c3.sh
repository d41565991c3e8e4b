set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_PAGES=1,16,256 KVIO_BENCH_SPLIT=1,5,1,4,1,3,1,2,2,2 KVIO_BENCH_JSON=$R/conc-b0-2.json timeout 250 ./bench-b0 --bench 'ceiling|spin-alone|kernel[0-9]\+kernel[0-9]' > $R/conc-b0-2.log 2>&1; echo "conc 2 rc=$? $SECONDS" >> $R/rc.txt; pk
