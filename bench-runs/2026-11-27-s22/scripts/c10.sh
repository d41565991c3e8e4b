set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
F='ceiling|v0-update-T-kvio-bf16/(4096|16384|65536)$|v0-update-batch-kvio-bf16-seq(1024|128)/16$'
for r in 1 2; do for v in new sv; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/v0-$v-$r.json timeout 90 ./bench-$v --bench "$F" > $R/v0-$v-$r.log 2>&1; echo "v0 $v $r rc=$? $SECONDS" >> $R/rc.txt
done; done; pk
for arch in sm90 sm80; do
KVIO_TEST_ARCH=$arch KVIO_REQUIRE_GPU=1 timeout 150 ./gpu_v0-sv --test-threads=4 > $R/t-v0-sv-$arch.log 2>&1; echo "v0 test $arch rc=$? $SECONDS" >> $R/rc.txt
pk
done
