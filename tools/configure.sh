#!/usr/bin/env bash
# Configures and builds Loom into ${LOOM_BUILD_DIR:-build}. CUDA is on only when nvcc is present
# and a GPU answers (override with LOOM_CUDA=ON|OFF); a machine without a GPU builds CPU-only.
# LOOM_TARGETS="loom ..." builds only those targets (the quick start builds just `loom`).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${LOOM_BUILD_DIR:-build}
if [ -z "${LOOM_CUDA:-}" ]; then
  if command -v nvcc >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then LOOM_CUDA=ON; else LOOM_CUDA=OFF; fi
fi
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA="$LOOM_CUDA" >/dev/null
targets=()
for t in ${LOOM_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j"$(nproc)" "${targets[@]}"
