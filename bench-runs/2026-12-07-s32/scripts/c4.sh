# c4.sh (session 32; pack: bench-lc bench-sx bench-wk gpu_v0-sx): lc is main since 52f34cb.
# 1. sx (sx.patch: the copying stream, shifted windows, and the fp8 stream on pages of up to
#    128 slots, host planner only): its v0 GPU tests and memcheck on the prefill test.
# 2. v0 rows on 16- to 128-token pages, one sequence and batches, lc against sx, two rounds
#    (the second in reverse order).
# 3. wk (wk.patch: weak asm loads in place of the volatile ones): slot, fp8, MLA rows against lc.
source gpu-pack/common.sh
jit() { KVIO_BENCH_GROUPS=none timeout 300 ./bench-$1 --bench '^$' > $R/jit-$1.log 2>&1; echo "jit $1 rc=$? $SECONDS" >> $R/rc.txt; }
for v in lc sx wk; do jit $v & done
rt gpu_v0-sx sm90 4 gpu
wait
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(16|32|64|128)$|v0-update-batch-kvio-(bf16|fp8-e4m3)-seq(1024|128)/(16|32|64|128)$'
W='ceiling|slot-update-(T|page)-kvio/(65536|16)$|slot-update-graph-latency-kvio-x100/(1|16|256)$|fp8-update-T-kvio[a-z0-9-]*/65536$|mla-update-T-kvio-(bf16|fp8-e4m3)/65536$'
vs="lc sx"
for r in 1 2; do
for v in $vs; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=16,32,64,128 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 90 ./bench-$v --bench "$V" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
vs="sx lc"; done
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 50 ./gpu_v0-sx --test-threads=1 gpu_v0_prefill_updates_match_reference > $R/t-memcheck-v0-prefill-sx.log 2>&1; echo "memcheck v0 prefill sx rc=$? $SECONDS" >> $R/rc.txt; pk
ws="lc wk"
for r in 1 2; do
for v in $ws; do
KVIO_BENCH_GROUPS=ceiling,slot-update,fp8-update,mla-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/w-$v-$r.json timeout 60 ./bench-$v --bench "$W" > $R/w-$v-$r.log 2>&1; echo "w $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
ws="wk lc"; done
pk
