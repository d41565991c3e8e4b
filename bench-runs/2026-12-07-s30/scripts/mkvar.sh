#!/usr/bin/env bash
# mkvar.sh NAME 'ptx op' : worktree of main with stream_group's loads through asm op, bench built to /tmp/gb/bench-NAME
set -euo pipefail
name=$1; op=$2
wt=/tmp/wt/$name
rm -rf $wt; git -C /work/main worktree prune; git -C /work/main worktree add -f --detach $wt HEAD >/dev/null
python3 - "$wt/kernels/src/ops.rs" "$op" <<'PY'
import sys
p, op = sys.argv[1], sys.argv[2]
s = open(p).read()
old = """    unsafe {
        let k = tile::load_copy::<2>(a.src_k.add(off), true, 1);
        let v = if with_v {
            tile::load_copy::<2>(a.src_v.add(off), true, 1)
        } else {
            [0; 8]
        };
        [k, v]
    }"""
new = """    unsafe {
        #[cfg(target_arch = "nvptx64")]
        let ld = |p: *const u8| -> Row {
            let w = ld_v4!("%s", reg64 p);
            [w[0], w[1], w[2], w[3], 0, 0, 0, 0]
        };
        #[cfg(not(target_arch = "nvptx64"))]
        let ld = |p: *const u8| tile::load_copy::<2>(p, true, 1);
        let k = ld(a.src_k.add(off));
        let v = if with_v { ld(a.src_v.add(off)) } else { [0; 8] };
        [k, v]
    }""" % op
assert s.count(old) == 1
open(p, "w").write(s.replace(old, new))
PY
source /tmp/env.sh
cd $wt
[ -d /tmp/tgt-$name ] || cp -r /tmp/tgt /tmp/tgt-$name
export CARGO_TARGET_DIR=/tmp/tgt-$name
exe=$(cargo bench --no-run --bench kvio --message-format=json 2>/tmp/s30/mk-$name.err | grep '"reason":"compiler-artifact"' | grep -v '"executable":null' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
strip -o /tmp/gb/bench-$name "$exe"
for f in /tmp/tgt-$name/release/build/kvio-*/out/kvio_sm90.ptx; do [ $f -nt /tmp/gb/bench-$name ] && cp $f /tmp/s30/ptx90-$name.ptx; done; ls -t /tmp/tgt-$name/release/build/kvio-*/out/kvio_sm90.ptx | head -1 | xargs -I{} cp {} /tmp/s30/ptx90-$name.ptx
ls -la /tmp/gb/bench-$name
