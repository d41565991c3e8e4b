#!/usr/bin/env bash
# pack.sh: gpu-pack/t.tar.xz for c1.sh from /tmp/gb (mk.sh's builds): the main build's tests
# and bench, and every variant's.
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rm -rf "$repo/gpu-pack"; mkdir -p "$repo/gpu-pack/b"
cd /tmp/gb
cp bench-main bench-lc bench-rl bench-nl bench-m2 bench-pc \
    gpu_v0-main gpu_blocks-main gpu_mla-main gpu_fp8-main gpu_v0-lc gpu_v0-nl gpu_mla-rl \
    "$repo/gpu-pack/b/"
cp "$(dirname "$0")/c1.sh" "$(dirname "$0")/c2.sh" "$repo/gpu-pack/"
cd "$repo/gpu-pack" && tar cf - b | xz -T0 -6 > t.tar.xz && rm -rf b && ls -la
