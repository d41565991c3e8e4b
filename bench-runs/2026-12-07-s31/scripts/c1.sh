# c1.sh (on the GPU machine, from the repository root: bash gpu-pack/c1.sh; carry gpu-pack):
# main's GPU tests for 68a5d1f and 810769a, then the v0 and MLA rows of main and the variants,
# two rounds in one process each, the second in reverse order.
source gpu-pack/common.sh
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(16|32|128)$|v0-update-batch-kvio-(bf16|fp8-e4m3)-seq1024/(16|32)$'
M='ceiling|mla-update-(T|prefill)-kvio[a-z0-9-]*/65536$'
vs="main lc nl"; ms="main rl"
grep -q H200 $R/gpu.txt && { vs="m2 main lc nl"; ms="pc main rl"; }
# The driver compiles a module's PTX when a process loads it (about 20-30 s for kvio's, then
# cached on the machine): every bench binary and the sm_80 test PTX load once, in the
# background and in parallel, while main's sm_90 tests run; the benches wait for them.
jit() { KVIO_BENCH_GROUPS=none timeout 300 ./bench-$1 --bench '^$' > $R/jit-$1.log 2>&1; echo "jit $1 rc=$? $SECONDS" >> $R/rc.txt; }
for v in $(echo $vs $ms | tr ' ' '\n' | sort -u); do jit $v & done
(KVIO_TEST_ARCH=sm80 KVIO_REQUIRE_GPU=1 timeout 300 ./gpu_blocks-main --test-threads=1 map_lengths > $R/jit-sm80.log 2>&1; echo "jit sm80 rc=$? $SECONDS" >> $R/rc.txt) &
rt gpu_v0-main sm90 4 gpu
rt gpu_blocks-main sm90 4
rt gpu_mla-main sm90 4
rt gpu_blocks-main sm80 4
wait
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 50 ./gpu_v0-main --test-threads=1 gpu_v0_prefill_updates_match_reference > $R/t-memcheck-v0-prefill.log 2>&1; echo "memcheck v0 prefill rc=$? $SECONDS" >> $R/rc.txt; pk
for r in 1 2; do
for v in $vs; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=16,32,128 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 60 ./bench-$v --bench "$V" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
for v in $ms; do
KVIO_BENCH_GROUPS=ceiling,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/m-$v-$r.json timeout 30 ./bench-$v --bench "$M" > $R/m-$v-$r.log 2>&1; echo "m $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
vs=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ' '); ms=$(echo $ms | tr ' ' '\n' | tac | tr '\n' ' ')
done
rt gpu_mla-rl sm90 4
rt gpu_v0-lc sm90 4 gpu
pk
