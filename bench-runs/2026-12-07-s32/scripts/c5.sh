# c5.sh (session 32; pack: bench-lc bench-sx gpu_v0-sx): c4 cut to the device time left
# (about 200 s): sx's v0 GPU tests, the v0 rows of lc and sx (two rounds, the second in
# reverse order), memcheck on the v0 prefill test if time is left; no wk.
source gpu-pack/common.sh
END=195
jit() { KVIO_BENCH_GROUPS=none timeout 120 ./bench-$1 --bench '^$' > $R/jit-$1.log 2>&1; echo "jit $1 rc=$? $SECONDS" >> $R/rc.txt; }
for v in lc sx; do jit $v & done
rt gpu_v0-sx sm90 4 gpu
wait
V='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/(16|32|64|128)$|v0-update-batch-kvio-(bf16|fp8-e4m3)-seq(1024|128)/(16|32|64|128)$'
vs="lc sx"
for r in 1 2; do
for v in $vs; do
KVIO_BENCH_GROUPS=ceiling,v0-update KVIO_BENCH_PAGES=16,32,64,128 KVIO_BENCH_JSON=$R/v-$v-$r.json timeout 45 ./bench-$v --bench "$V" > $R/v-$v-$r.log 2>&1; echo "v $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done
vs="sx lc"; done
left=$((END-SECONDS)); [ $left -gt 10 ] && { KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 50 ./gpu_v0-sx --test-threads=1 gpu_v0_prefill_updates_match_reference > $R/t-memcheck-v0-prefill-sx.log 2>&1; echo "memcheck v0 prefill sx rc=$? $SECONDS" >> $R/rc.txt; }
pk
