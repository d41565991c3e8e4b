set -x
cd gpu-pack && tar xJf t.tar.xz && cd b
R=$OUT/r; mkdir -p $R
pk() { (cd $OUT && tar czf r.tgz r); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(8|16)$|v0-update-batch-kvio-(bf16|fp8-e4m3)-(seq1024|chunked1024)/(8|16)$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$'
vs="main pf1 pf2 l2"; grep -q H200 $R/gpu.txt && vs="m2 main pf1 pf2 l2"
ms="main mpf"; grep -q H200 $R/gpu.txt && ms="pc main mpf"
for r in 1 2; do
for v in $vs; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=8,16 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 60 ./bench-$v --bench "$V" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
for v in $ms; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-$r.json timeout 40 ./bench-$v --bench "$M" > $R/m-$v-$r.log 2>&1; echo "m $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
vs=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ' '); ms=$(echo $ms | tr ' ' '\n' | tac | tr '\n' ' ')
done
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 30 ./gpu_mla-mpf --test-threads=4 gpu > $R/t-mla-mpf-sm90.log 2>&1; echo "t mla mpf rc=$? $SECONDS" >> $R/rc.txt; pk
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 150 ./gpu_v0-pf1 --test-threads=4 gpu --skip block_copies > $R/t-v0-pf1-sm90.log 2>&1; echo "t v0 pf1 rc=$? $SECONDS" >> $R/rc.txt
pk
