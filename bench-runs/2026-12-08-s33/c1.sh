# c1.sh (session 33, for the next GPU session): from the repository root on the GPU machine,
# `bash gpu-pack/c1.sh` with carry ["gpu-pack"]. The pack (`scripts/variant pack` with this
# folder): bench-{main,sg,f8,rl,wk}, main's GPU tests, gpu_v0-sg (README here).
# 1. main's GPU tests (sm_90: gpu_v0's GPU tests, gpu_write, gpu_blocks, gpu_mla, gpu_fp8;
#    sm_80: gpu_v0, gpu_fp8, gpu_mla), memcheck on the v0 prefill test; sg's gpu_v0.
# 2. main against each variant, two rounds (the second in reverse order), one process each:
#    v0 rows (main, sg, f8), MLA rows (main, rl), slot/fp8/MLA rows (main, wk); then main's
#    v0-against-NHD decode latency in a graph.
source gpu-pack/common.sh
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(16|32|64|128)$|v0-update-batch-kvio-(bf16|fp8-e4m3)-seq(1024|128)/(16|32|64|128)$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$'
W='ceiling|slot-update-(T|page)-kvio/(16384|65536|16)$|slot-update-graph-latency-kvio-x100/(1|16|64|256)$|fp8-update-T-kvio[a-z0-9-]*/65536$|mla-update-T-kvio-(bf16|fp8-e4m3)/65536$'
L='ceiling|v0-update-graph-latency-kvio-(v0|nhd)-x100/(1|16|64|256)$'
# The driver compiles each module's PTX once a machine (20-30 s, then cached): every bench
# and the sm_80 test PTX load in the background while main's sm_90 tests run.
jit() { KVIO_BENCH_GROUPS=none timeout 300 ./bench-$1 --bench '^$' > $R/jit-$1.log 2>&1; echo "jit $1 rc=$? $SECONDS" >> $R/rc.txt; }
for v in main sg f8 rl wk; do jit $v & done
(KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 300 ./gpu_blocks-main --test-threads=1 map_lengths > $R/jit-sm80.log 2>&1; echo "jit sm80 rc=$? $SECONDS" >> $R/rc.txt) &
rt gpu_v0-main sm90 4 gpu
rt gpu_write-main sm90 4
rt gpu_blocks-main sm90 4
rt gpu_mla-main sm90 4
rt gpu_fp8-main sm90 4
wait
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 50 ./gpu_v0-main --test-threads=1 gpu_v0_prefill_updates_match_reference > $R/t-memcheck-v0-prefill.log 2>&1; echo "memcheck v0 prefill rc=$? $SECONDS" >> $R/rc.txt; pk
vs="main sg f8"; ms="main rl"; ws="main wk"
for r in 1 2; do
for v in $vs; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=16,32,64,128 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 60 ./bench-$v --bench "$V" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
for v in $ms; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-$r.json timeout 30 ./bench-$v --bench "$M" > $R/m-$v-$r.log 2>&1; echo "m $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
for v in $ws; do
KVIO_BENCH_GROUPS=ceiling,slot-update,fp8-update,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/w-$v-$r.json timeout 40 ./bench-$v --bench "$W" > $R/w-$v-$r.log 2>&1; echo "w $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
vs="f8 sg main"; ms="rl main"; ws="wk main"
done
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/l-main.json timeout 40 ./bench-main --bench "$L" > $R/l-main.log 2>&1; echo "l main rc=$? $SECONDS" >> $R/rc.txt; pk
rt gpu_v0-sg sm90 4 gpu
rt gpu_v0-main sm80 4 gpu
rt gpu_fp8-main sm80 4
rt gpu_mla-main sm80 4
pk
