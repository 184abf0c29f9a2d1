#!/usr/bin/env bash
# On the GPU machine: build with CUDA, run every CTest label (cuda included), then the kernel
# benchmarks against the PyTorch peer. Logs go to ${OUT:-gpu-out} (build.log, ctest.log,
# compare.txt, bench.json, torch.json). Stages: LOOM_STAGES="build test bench train sanitize attn nf4"
# (default: the first three). train = the 1B-shape LoRA training benchmark against transformers +
# PEFT; sanitize = every cuda-labelled test program under compute-sanitizer memcheck, and the
# attention, reduction and optimizer kernel tests under racecheck and synccheck, logs in
# $OUT/sanitize/; attn = tools/gpu/gpu_attn_check.sh (every flash kernel by name), logs in $OUT/attn;
# nf4 = the NF4 test and dequantise benchmark, then bitsandbytes' (when .peers carries its wheel).
# LOOM_BENCH_ARGS / LOOM_PEER_ARGS pass through to bench/run_all.sh (e.g. a --benchmark_filter).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
stages=${LOOM_STAGES:-build test bench}
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/build.log"
if [[ $stages == *build* ]]; then
  BUILD_LOG="$out/build.log" tools/gpu/build.sh | tee -a "$out/build.log"
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
    tools/gpu/gpu_train_bench.sh 2>&1 | tail -3
fi
if [[ $stages == *sanitize* ]]; then
  # One run per GoogleTest program (all its cases at once), and one per other cuda-labelled test
  # (the shell scripts and mpiexec launches that run `loom`): those run through ctest under
  # --target-processes all, so every process they start is checked, with CTest's own environment.
  mkdir -p "$out/sanitize"
  mapfile -t runs < <(ctest --test-dir build-gpu -L cuda --show-only=json-v1 | python3 -c '
import json, sys
seen = []
for t in json.load(sys.stdin)["tests"]:
    cmd = t["command"]
    gtest = len(cmd) > 1 and cmd[1].startswith("--gtest_filter")
    run = "exe " + cmd[0] if gtest else "ctest " + t["name"]
    if run not in seen: seen.append(run)
print("\n".join(seen))')
  # Kernels with shared memory, warp shuffles and block barriers: attention, the reductions (norms,
  # cross entropy, the fused lm_head + loss), the optimizers. tools/gpu/sanitizer_triage.py gives each
  # log its verdict: reports from inside NVIDIA's libraries (racecheck hazards in cuBLASLt's nvjet
  # kernels, NCCL's kernel-image probe at init) are counted apart from Loom's.
  race_re='attention|norm|cross_entropy|adamw'
  # Tests that provoke an out-of-memory on purpose (a clear error is what they check): memcheck
  # reports the failing cudaMallocAsync as an API error, so they are left out here.
  gtest_skip='-*OutOfMemory*'
  failed=0
  # sanitize TOOL LABEL LOG [sanitizer flags...] -- COMMAND...: one run, its verdict printed; a
  # failing test fails the stage too (exit 86 alone is the sanitizer counting NVIDIA's reports).
  sanitize() {
    local tool=$1 label=$2 log=$3 flags=()
    shift 3
    while [ "$1" != -- ]; do flags+=("$1"); shift; done
    shift
    timeout "${LOOM_SANITIZE_TIMEOUT:-900}" compute-sanitizer --tool "$tool" "${flags[@]}" --error-exitcode 86 \
      "$@" > "$log" 2>&1
    local rc=$? verdict triage
    verdict=$(python3 tools/gpu/sanitizer_triage.py "$log")
    triage=$?
    [ $rc -ne 0 ] && [ $rc -ne 86 ] && { triage=1; verdict="$verdict; the test exited $rc"; }
    echo "sanitize $tool $label: $verdict"
    [ $triage -ne 0 ] && failed=1
  }
  for run in "${runs[@]}"; do
    kind=${run%% *} target=${run#* }
    name=$(basename "$target")
    tools=(memcheck)
    [[ $kind = exe && $name =~ $race_re ]] && tools+=(racecheck synccheck)
    for tool in "${tools[@]}"; do
      extra=()
      [ "$tool" = memcheck ] && extra=(--leak-check full)
      if [ "$kind" = exe ]; then
        cmd=("$target" "--gtest_filter=$gtest_skip")
      else
        extra+=(--target-processes all)
        cmd=(ctest --test-dir build-gpu -R "^${target}\$" --output-on-failure)
      fi
      sanitize "$tool" "$name" "$out/sanitize/${tool}_${name}.log" "${extra[@]}" -- "${cmd[@]}"
    done
  done
  # The flash kernels by name (the warp-specialised ones: mbarriers, named barriers, tensor-map
  # reductions) once under racecheck and synccheck as well.
  att=$(find build-gpu -name kernels_test_attention_cuda -type f -perm -u+x | head -1)
  for tool in ${att:+racecheck synccheck}; do
    sanitize "$tool" "attention flash kernels" "$out/sanitize/${tool}_attention_flash.log" -- \
      "$att" --gtest_filter='FlashKernels*'
  done
  echo "sanitize: $([ $failed = 0 ] && echo clean || echo FINDINGS, see $out/sanitize/)"
fi
if [[ $stages == *attn* ]]; then
  # Every flash kernel by name, tested and timed beside the dispatcher's choice.
  OUT="$out/attn" timeout "${LOOM_ATTN_TIMEOUT:-540}" tools/gpu/gpu_attn_check.sh 2>&1 |
    grep -E "^(test|== |peer|build|flash kernel)|/bf16/|Failure|rel_error|which is|b[0-9]+ s[0-9]+"
fi
if [[ $stages == *nf4* ]]; then
  if ! BUILD_LOG="$out/build.log" tools/gpu/build.sh loom_bench kernels_test_nf4_cuda > /dev/null; then
    echo "nf4: build FAILED (see $out/build.log)"
    grep -E "error|FAILED" "$out/build.log" | tail -10
  fi
  timeout 120 build-gpu/tests/kernels/kernels_test_nf4_cuda > "$out/nf4_test.log" 2>&1 ||
    echo "nf4 test FAILED (see $out/nf4_test.log)"
  timeout 60 build-gpu/bench/loom_bench --benchmark_filter=nf4_deq \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true 2>&1 | grep median
  ls .peers/bitsandbytes-*.whl > /dev/null 2>&1 &&
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/bitsandbytes-*.whl > /dev/null 2>&1
  PYTHONPATH=/tmp/site python3 bench/peer_torch.py --out "$out/nf4_torch.json" --filter nf4_deq 2>&1 | grep -i "nf4\|error" | head -4
fi
