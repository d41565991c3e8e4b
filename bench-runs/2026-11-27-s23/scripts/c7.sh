set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
for t in gpu_pdl gpu_graph_step gpu_fp8; do
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 100 ./$t-fin --test-threads=4 > $R/t-$t-sm90.log 2>&1; echo "$t sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
done
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 220 ./gpu_slice_layouts-fin > $R/t-slice-sm90.log 2>&1; echo "slice sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
