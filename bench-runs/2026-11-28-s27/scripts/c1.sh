set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
F='ceiling|v0-update-T-kvio-(fp8-e4m3|bf16)/16384$|v0-update-batch-kvio-(fp8-e4m3|bf16)-(seq1024|chunked1024)/16$|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$|fp8-update-T-kvio-e4m3/65536$'
for r in 1 2; do
for v in rr n4; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 60 ./bench-$v --bench "$F" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
for v in rr n4 m1 m2 m3 m5; do
KVIO_BENCH_GROUPS=ceiling,mla-update,fp8-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-$r.json timeout 50 ./bench-$v --bench "$M" > $R/m-$v-$r.log 2>&1; echo "m $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
if [ $r = 1 ]; then
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 120 ./gpu_v0-n4 --test-threads=4 gpu > $R/t-v0-sm90.log 2>&1; echo "v0 sm90 rc=$? $SECONDS" >> $R/rc.txt; pk
for v in m3 m5; do KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 60 ./gpu_mla-$v --test-threads=4 gpu > $R/t-mla-$v-sm90.log 2>&1; echo "mla $v sm90 rc=$? $SECONDS" >> $R/rc.txt; pk; done
fi
done
