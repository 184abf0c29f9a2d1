#!/usr/bin/env bash
# On the GPU machine: build with CUDA, run every CTest label (cuda included), then the kernel
# benchmarks against the PyTorch peer. Logs go to ${OUT:-gpu-out} (build.log, ctest.log,
# compare.txt, bench.json, torch.json). Stages: LOOM_STAGES="build test bench train" (default: the
# first three; train = the 1B-shape LoRA training benchmark against transformers + PEFT).
# LOOM_BENCH_ARGS / LOOM_PEER_ARGS pass through to bench/run_all.sh (e.g. a --benchmark_filter).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
stages=${LOOM_STAGES:-build test bench}
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/build.log"
if [[ $stages == *build* ]]; then
  start=$(date +%s)
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      && timeout "${LOOM_BUILD_TIMEOUT:-360}" cmake --build build-gpu -j"$(nproc)"; } >> "$out/build.log" 2>&1
  echo "build: exit $? in $(( $(date +%s) - start )) s" | tee -a "$out/build.log"
  grep -E "error|FAILED" "$out/build.log" | head -20
fi
if [[ $stages == *test* ]]; then
  timeout "${LOOM_TEST_TIMEOUT:-240}" ctest --test-dir build-gpu --output-on-failure -j8 --timeout 120 > "$out/ctest.log" 2>&1
  echo "ctest: exit $?"
  grep -E "tests passed|tests failed|FAILED|Failed|Skipped|Not Run" "$out/ctest.log" | head -40
  grep -A3 "Label Time Summary" "$out/ctest.log"
fi
if [[ $stages == *bench* ]]; then
  tmp=$(mktemp -d)
  timeout "${LOOM_BENCH_TIMEOUT:-300}" bench/run_all.sh "$tmp" > "$tmp/run.log" 2>&1
  echo "bench: exit $?"
  cp "$tmp/compare.txt" "$tmp/bench.json" "$out/" 2>/dev/null
  cp "$tmp/torch.json" "$out/" 2>/dev/null
  [ -f "$tmp/compare.txt" ] && cat "$tmp/compare.txt" || tail -40 "$tmp/run.log"
fi
if [[ $stages == *train* ]]; then
  LOOM_TRAIN_SHAPE=${LOOM_TRAIN_SHAPE:-1b} LOOM_TRAIN_STEPS=${LOOM_TRAIN_STEPS:-20} timeout "${LOOM_TRAIN_TIMEOUT:-300}" \
    tools/gpu_train_bench.sh 2>&1 | tail -3
fi
