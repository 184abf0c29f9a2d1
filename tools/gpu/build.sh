#!/usr/bin/env bash
# On the GPU machine: makes build-gpu hold the given targets (all of them without arguments). Uses
# the carried .prebuilt/build-gpu.tar.xz when tools/gpu/prebuilt.sh accepts it (it holds every
# target), else configures and builds here. Build output goes to ${BUILD_LOG:-/dev/stdout}; prints
# one line at the end: "build: exit N in S s (prebuilt|built here)".
#   tools/gpu/build.sh loom loom_bench kernels_test_attention_cuda
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
log=${BUILD_LOG:-/dev/stdout}
start=$(date +%s)
msg=$(mktemp)
source tools/gpu/prebuilt.sh > "$msg"
cat "$msg"; [ "$log" = /dev/stdout ] || cat "$msg" >> "$log"
rm -f "$msg"
if [ "$LOOM_PREBUILT" = 1 ]; then
  echo "build: exit 0 in $(( $(date +%s) - start )) s (prebuilt)"
  exit 0
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DLOOM_BUILD_BENCH=ON && timeout "${LOOM_BUILD_TIMEOUT:-480}" cmake --build build-gpu -j"$(nproc)" "${targets[@]}"; } \
  >> "$log" 2>&1
rc=$?
echo "build: exit $rc in $(( $(date +%s) - start )) s (built here)"
[ $rc = 0 ] || grep -E "error|FAILED" "$log" 2> /dev/null | head -20
exit $rc
