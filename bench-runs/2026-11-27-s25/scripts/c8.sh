set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
ncu --version > $R/ncu-version.txt 2>&1
n=0
for x in 'v0-update-page-kvio-fp8-e4m3/16$' 'v0-update-batch-kvio-fp8-e4m3-seq1024/16$'; do
n=$((n+1))
KVIO_BENCH_GROUPS=v0-update KVIO_BENCH_PAGES=16 timeout 150 ncu --kernel-name kvio_update_stream_fp8 --launch-skip 0 --launch-count 1 --section SourceCounters --section WarpStateStats --page source --print-source sass --csv ./bench-bt --bench "$x" > $R/src-$n.csv 2> $R/src-$n.err; echo "src $n $x rc=$? $SECONDS" >> $R/rc.txt; pk
done
