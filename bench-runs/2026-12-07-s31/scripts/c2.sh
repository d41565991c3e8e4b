# c2.sh (second call, same pack): what c1 had no time for: the variants' GPU tests, main's
# gpu_fp8, and the variants under memcheck on the v0 prefill test.
source gpu-pack/common.sh
rt gpu_mla-rl sm90 4
rt gpu_v0-lc sm90 4 gpu
for v in lc nl; do
KVIO_TEST_ARCH=sm90 KVIO_REQUIRE_GPU=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 50 ./gpu_v0-$v --test-threads=1 gpu_v0_prefill_updates_match_reference > $R/t-memcheck-v0-prefill-$v.log 2>&1; echo "memcheck v0 prefill $v rc=$? $SECONDS" >> $R/rc.txt; pk
done
rt gpu_v0-nl sm90 4 gpu
rt gpu_fp8-main sm90 4
pk
