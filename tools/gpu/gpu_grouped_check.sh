#!/usr/bin/env bash
# On the GPU machine: the grouped expert GEMM kernels' tests and their times at Qwen3-30B-A3B's and
# Mixtral-8x7B's shapes, the TMA-fed kernel (kernels/grouped_gemm_tma.h, alone and in clusters of two)
# beside the cp.async kernel (sm90, sm90_wide) and cuBLAS (loop, cublas_grouped), product by product,
# with a ratio column against sm90_wide (what the models run today). Also the scale_blocks kernel's
# test (one launch for a weight gradient's experts without rows) and ops::'s grouped tests over them. PROFILE=1: ncu of sm90_wide and of
# the TMA kernel (cluster of two) on gate_up's forward.
# Writes ctest.txt, bench.json and ncu_*.txt under ${OUT:-gpu-grouped-out}.
#   tools/gpu/gpu_grouped_check.sh      (about 3 minutes with the prebuilt binaries; Qwen3LikeShapes
#   alone takes over 2: GROUPED_TESTS='GroupedGemmCuda.*:-*Qwen3*' to leave it out)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-gpu-grouped-out}
mkdir -p "$out"
BUILD_LOG="$out/build.log" tools/gpu/build.sh loom_bench kernels_test_grouped_gemm_cuda kernels_test_elementwise_cuda \
  engine_test_grouped_matmul_cuda \
  || { tail -30 "$out/build.log"; exit 1; }
# The new kernel could hang on a protocol bug: each test binary under its own timeout.
timeout 60 build-gpu/tests/kernels/kernels_test_elementwise_cuda --gtest_filter='*ScaleBlocks*' > "$out/ctest.txt" 2>&1
echo "scale_blocks test: exit $?"
timeout "${GROUPED_TEST_TIMEOUT:-300}" build-gpu/tests/kernels/kernels_test_grouped_gemm_cuda \
  --gtest_filter="${GROUPED_TESTS:-GroupedGemmCuda.*}" >> "$out/ctest.txt" 2>&1
echo "grouped GEMM tests: exit $? ($(grep -cE '^\[       OK' "$out/ctest.txt") passed, $(grep -cE '^\[  FAILED  \] Grouped' "$out/ctest.txt") failed)"
# ops:: over the same kernels (empty experts' weight gradients in one launch, kSm90Tma by name).
timeout 240 build-gpu/tests/engine/engine_test_grouped_matmul_cuda \
  --gtest_filter="${GROUPED_OPS_TESTS:-GroupedMatmulCuda.*:-*Qwen3*}" >> "$out/ctest.txt" 2>&1
echo "ops grouped tests: exit $?"
grep -E "FAILED|Failure|worst element" "$out/ctest.txt" | head -12
timeout 300 build-gpu/bench/loom_bench \
  --benchmark_filter='grouped_gemm/bf16/(qwen3_30b_a3b|mixtral_8x7b)/(gate_up|down)_(fwd|dgrad)(_dual_r16)?/(sm90|sm90_wide|sm90_tma|sm90_tma_c2|loop|cublas_grouped)(/|$)' \
  --benchmark_min_time=0.05 --benchmark_out="$out/bench.json" --benchmark_out_format=json > "$out/bench.log" 2>&1
echo "bench: exit $?"
python3 - "$out/bench.json" <<'PY'
import json, sys
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("run_type") != "iteration" or "error_occurred" in b:
        continue
    name = b["name"].replace("/manual_time", "")
    case, variant = name.rsplit("/", 1)
    rows.setdefault(case, {})[variant] = (b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b["time_unit"]],
                                          b.get("flops_per_second", 0) / 1e12)
variants = ["loop", "cublas_grouped", "sm90", "sm90_wide", "sm90_tma", "sm90_tma_c2"]
print(f"{'product (us, TFLOP/s)':52}" + "".join(f"{v:>18}" for v in variants) + f"{'wide/tma_c2':>13}")
for case in sorted(rows):
    r = rows[case]
    cells = "".join(f"{r[v][0]:10.1f} {r[v][1]:6.0f}" + " " if v in r else f"{'-':>18}" for v in variants)
    ratio = f"{r['sm90_wide'][0] / r['sm90_tma_c2'][0]:.2f}" if "sm90_wide" in r and "sm90_tma_c2" in r else "-"
    print(f"{case.replace('grouped_gemm/bf16/', ''):52}{cells}{ratio:>13}")
PY
if [ "${PROFILE:-0}" = 1 ]; then
  tools/gpu/ncu_cases.sh "$out" 'grouped_gemm_sm90' grouped_gemm/bf16/qwen3_30b_a3b/gate_up_fwd/sm90_wide grouped_gemm/bf16/qwen3_30b_a3b/gate_up_fwd/sm90_tma_c2
fi
