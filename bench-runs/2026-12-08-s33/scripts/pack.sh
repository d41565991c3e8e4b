#!/usr/bin/env bash
# pack.sh [FILE...]: gpu-pack/t.tar.xz from the named executables in /tmp/gb (mk.sh's builds;
# default: what c1.sh and c2.sh run), with the call scripts beside it in gpu-pack/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(bench-main bench-lc bench-rl bench-nl bench-m2 bench-pc
    gpu_v0-main gpu_blocks-main gpu_mla-main gpu_fp8-main gpu_v0-lc gpu_v0-nl gpu_mla-rl)
rm -rf "$repo/gpu-pack"; mkdir -p "$repo/gpu-pack/b"
for f in "${files[@]}"; do cp "/tmp/gb/$f" "$repo/gpu-pack/b/"; done
cp "$here"/c*.sh "$repo/gpu-pack/"   # c1-c3 and common.sh
cd "$repo/gpu-pack" && tar cf - b | xz -T0 -6 > t.tar.xz && rm -rf b && ls -la
