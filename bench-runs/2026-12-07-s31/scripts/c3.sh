# c3.sh (pack: pack.sh bench-main bench-sass gpu_blocks-main sass-main sass-sass gpu_v0-sass
# gpu_write-sass gpu_blocks-sass gpu_mla-sass): the `sass` feature on the GPU.
# 1. Module load time, one small test's process each: the PTX with the driver's JIT cache on
#    (first and again) and off (CUDA_CACHE_DISABLE=1: a machine or container that has not run
#    kvio before), per PTX flavour; the sass build (machine code: nothing to compile).
# 2. The sass build's GPU tests (sm_90 machine code; `sass` checks that it was loaded).
# 3. Bench rows, the sass build against main's PTX in one call, two rounds: whether ptxas
#    12.9's code runs as fast as the driver's compile of the same PTX.
source gpu-pack/common.sh
load() { # load NAME EXE ARCH CACHE_DISABLE
  t0=$EPOCHREALTIME
  CUDA_CACHE_DISABLE=$4 KVIO_TEST_ARCH=$3 KVIO_REQUIRE_GPU=1 timeout 150 ./$2 --test-threads=1 --nocapture gpu_loads_machine_code > $R/load-$1.log 2>&1; rc=$?
  echo "load $1 ($2 $3 cache_disable=$4) rc=$rc $(awk "BEGIN{print $EPOCHREALTIME - $t0}") s" >> $R/rc.txt; pk; }
# first: cache on (compiles unless the machine's cache holds it, then stores it); cold: cache
# off (compiles); warm: cache on (read from the cache). A cache-off run neither reads nor
# writes the cache.
for a in 90 80; do
load ptx$a-first sass-main sm$a 0
load ptx$a-cold sass-main sm$a 1
load ptx$a-warm sass-main sm$a 0
done
load sass90-cold sass-sass sm90 1
load sass90-again sass-sass sm90 1
rt sass-sass sm90 1
rt gpu_v0-sass sm90 4 gpu
rt gpu_write-sass sm90 4
rt gpu_blocks-sass sm90 4
rt gpu_mla-sass sm90 4
B='ceiling|v0-update-page-kvio-(fp8-e4m3|bf16)/16$|mla-update-T-kvio-(bf16|fp8-e4m3)/65536$|slot-update-(T|page)-kvio/(65536|16)$|slot-update-graph-latency-kvio-x100/(1|256)$'
vs="main sass"
for r in 1 2; do for v in $vs; do
KVIO_BENCH_GROUPS=ceiling,v0-update,mla-update,slot-update KVIO_BENCH_PAGES=16 KVIO_BENCH_JSON=$R/b-$v-$r.json timeout 90 ./bench-$v --bench "$B" > $R/b-$v-$r.log 2>&1; echo "b $v $r rc=$? $SECONDS" >> $R/rc.txt; pk
done; vs="sass main"; done
pk
