#!/usr/bin/env bash
# mkmpf.sh NAME: main + an L2 prefetch of the group's next row in for_each_row
set -euo pipefail
name=$1
wt=/tmp/wt/$name
rm -rf $wt; git -C /work/main worktree prune; git -C /work/main worktree add -f --detach $wt 270ebed >/dev/null
python3 - "$wt/kernels/src/ops.rs" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = """            let $from = unsafe { row_source($a, tok) };
            $($early)*
"""
new = """            let $from = unsafe { row_source($a, tok) };
            #[cfg(target_arch = "nvptx64")]
            if tok + $g.step < $a.num_tokens {
                // SAFETY: the next row of this group lies in the sources; a prefetch reads
                // nothing architecturally.
                let next = unsafe { row_source($a, tok + $g.step) };
                let (lines_k, off) = ($a.chunk_bytes.div_ceil(128), 128 * $g.lane);
                let p = if $g.lane < lines_k {
                    Some(unsafe { next[0].add(off as usize) })
                } else if off - 128 * lines_k < $a.chunk_bytes_v {
                    Some(unsafe { next[1].add((off - 128 * lines_k) as usize) })
                } else {
                    None
                };
                if let Some(p) = p {
                    unsafe { core::arch::asm!("prefetch.global.L2 [{p}];", p = in(reg64) p, options(nostack, preserves_flags)) };
                }
            }
            $($early)*
"""
assert s.count(old) == 1
open(p, "w").write(s.replace(old, new))
PY
source /tmp/env.sh
cd $wt
[ -d /tmp/tgt-$name ] || cp -r /tmp/tgt-l2 /tmp/tgt-$name
export CARGO_TARGET_DIR=/tmp/tgt-$name
exe=$(cargo bench --no-run --bench kvio --message-format=json 2>/tmp/s30/mk-$name.err | grep '"reason":"compiler-artifact"' | grep -v '"executable":null' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
strip -o /tmp/gb/bench-$name "$exe"
ls -t /tmp/tgt-$name/release/build/kvio-*/out/kvio_sm90.ptx | head -1 | xargs -I{} cp {} /tmp/s30/ptx90-$name.ptx
ls -la /tmp/gb/bench-$name
