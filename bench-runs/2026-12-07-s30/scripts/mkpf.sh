#!/usr/bin/env bash
# mkpf.sh NAME DIST: main + an L2 prefetch of this lane's rows DIST items ahead in stream_body
set -euo pipefail
name=$1; dist=$2
wt=/tmp/wt/$name
rm -rf $wt; git -C /work/main worktree prune; git -C /work/main worktree add -f --detach $wt 270ebed >/dev/null
python3 - "$wt/kernels/src/ops.rs" "$dist" <<'PY'
import sys
p, dist = sys.argv[1], sys.argv[2]
s = open(p).read()
old = """            quad as u64 * STREAM_UNITS,
        );
        item += g.step;
"""
new = """            quad as u64 * STREAM_UNITS,
        );
        item += g.step;
        #[cfg(target_arch = "nvptx64")]
        {
            let ahead = item + (%s - 1) * g.step;
            if ahead < items {
                let (r2, _) = ((ahead / STREAM_LANES) as u32, 0u32);
                let (r2, q2) = index::split_u32(r2, quads);
                let (tb2, h2) = index::split_u32(r2, heads);
                let t2 = tb2 as u64 * STREAM_LANES + lane as u64;
                if t2 < a.num_tokens {
                    let at2 = t2 * a.src_token_stride
                        + h2 as u64 * a.src_head_stride
                        + 16 * q2 as u64 * STREAM_UNITS;
                    // SAFETY: a prefetch reads nothing architecturally; the address lies in
                    // the sources (token t2 < num_tokens, head < heads, its quad's groups).
                    unsafe {
                        core::arch::asm!("prefetch.global.L2 [{p}];", p = in(reg64) a.src_k.add(at2 as usize), options(nostack, preserves_flags));
                        if with_v {
                            core::arch::asm!("prefetch.global.L2 [{p}];", p = in(reg64) a.src_v.add(at2 as usize), options(nostack, preserves_flags));
                        }
                    }
                }
            }
        }
""" % dist
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
