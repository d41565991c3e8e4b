#!/usr/bin/env bash
# mk.sh NAME BASE [TEST...]: a worktree of commit BASE with NAME.patch (this folder) applied,
# its bench (and the named test executables) built release and stripped into /tmp/gb as
# bench-NAME and TEST-NAME; its PTX copied to /tmp/s33/ptx{90,80}-NAME.ptx. A NAME without a
# patch here builds BASE as it is (main, or an earlier commit to compare with). MK_FEATURES
# (e.g. "--features sass") goes to every cargo build; MK_TARGET is the target folder (default
# /tmp/tgt-s33). Needs KVIO_PTXAS (the README's "How the PTX is built").
set -euo pipefail
name=$1; base=$2; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
wt=/tmp/s33/wt-$name
mkdir -p /tmp/s33 /tmp/gb
rm -rf "$wt"; git -C "$repo" worktree prune
git -C "$repo" worktree add -f --detach "$wt" "$base" >/dev/null
[ ! -f "$here/$name.patch" ] || git -C "$wt" apply "$here/$name.patch"
cd "$wt"
# One target folder for every build, one build at a time: each rebuilds only what its change
# touched (the kernels' nested build, kvio, the executables), which are copied out at once.
export CARGO_TARGET_DIR=${MK_TARGET:-/tmp/tgt-s33}
pick() { grep '"reason":"compiler-artifact"' | grep -v '"executable":null' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1; }
exe=$(cargo bench --no-run --bench kvio ${MK_FEATURES:-} --message-format=json 2>/tmp/s33/mk-$name.err | pick)
strip -o /tmp/gb/bench-$name "$exe"
for t in "$@"; do
    exe=$(cargo test --release --no-run --test "$t" ${MK_FEATURES:-} --message-format=json 2>>/tmp/s33/mk-$name.err | pick)
    strip -o "/tmp/gb/$t-$name" "$exe"
done
for a in 90 80; do
    ls -t "$CARGO_TARGET_DIR"/release/build/kvio-*/out/kvio_sm$a.ptx | head -1 |
        xargs -I{} cp {} "/tmp/s33/ptx$a-$name.ptx"
done
ls -la /tmp/gb/*-"$name"
