set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
for arch in sm90 sm80; do for t in gpu_write gpu_mla gpu_slice_layouts gpu_pdl gpu_graph_step gpu_v0 gpu_fp8; do
KVIO_TEST_ARCH=$arch KVIO_REQUIRE_GPU=1 timeout 120 ./$t --test-threads=4 > $R/t-$t-$arch.log 2>&1; echo "$t $arch rc=$? $SECONDS" >> $R/rc.txt
done; done; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 100 ./gpu_stress > $R/t-stress-sm90.log 2>&1; echo "stress sm90 rc=$? $SECONDS" >> $R/rc.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 ./gpu_mla --test-threads=1 > $R/san-mla.log 2>&1; echo "san mla rc=$? $SECONDS" >> $R/rc.txt
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 ./gpu_write --test-threads=1 > $R/san-write.log 2>&1; echo "san write rc=$? $SECONDS" >> $R/rc.txt
pk
F='ceiling|mla-update-T-kvio[a-z0-9-]*/65536$|slot-update-T-kvio[a-z0-9-]*/(16384|65536)$|(slot-update|mla-update)-graph-latency-kvio[a-z0-9-]*/(1|16|64|256)$'
for r in 1 2; do for v in head new; do
KVIO_BENCH_GROUPS=ceiling,mla-update,slot-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/b-$v-$r.json timeout 90 ./bench-$v --bench "$F" > $R/b-$v-$r.log 2>&1; echo "bench $v $r rc=$? $SECONDS" >> $R/rc.txt
done; done; pk
KVIO_BENCH_GROUPS=concurrent KVIO_BENCH_PAGES=1,16 KVIO_BENCH_JSON=$R/conc-new.json timeout 120 ./bench-new --bench > $R/conc-new.log 2>&1; echo "conc new rc=$? $SECONDS" >> $R/rc.txt
pk
