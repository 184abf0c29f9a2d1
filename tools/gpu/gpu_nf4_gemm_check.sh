#!/usr/bin/env bash
# On the GPU machine: whether the grouped GEMM that multiplies by NF4 codes
# (cuda::sm90_grouped_gemm_nf4, kernels/cuda/grouped_gemm_nf4.cuh) beats dequantising the experts
# first, product by product, at Qwen3-30B-A3B's shapes (128 experts, 4 x 2048 tokens, top 8).
# Runs its tests (bit-exact against the dequantised product), then the micro-benchmarks, and prints
# for each product: the bf16 product, the NF4 product, and the bf16 product plus its dequantisation
# (nf4_dequantize_experts of all 128 experts of that projection, what the unfused path pays once per
# product). The models use the NF4 product only where it wins (models/layers.cpp, ExpertLinear). Rows
# sm90_tma: the TMA-fed kernel (kernels/grouped_gemm_tma.h), whose producer warpgroup dequantises while
# its consumers multiply.
# Writes ctest.txt and bench.json under ${OUT:-gpu-nf4-out}.
#   tools/gpu/gpu_nf4_gemm_check.sh      (about 2 minutes with the prebuilt binaries)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-gpu-nf4-out}
mkdir -p "$out"
BUILD_LOG="$out/build.log" tools/gpu/build.sh loom_bench kernels_test_grouped_gemm_nf4_cuda engine_test_grouped_matmul_cuda \
  || { tail -30 "$out/build.log"; exit 1; }
timeout 120 ctest --test-dir build-gpu -R "GroupedGemmNf4Cuda|GroupedMatmulCuda.Nf4" --timeout 110 --output-on-failure \
  > "$out/ctest.txt" 2>&1
grep -E "tests passed|Failed|\*\*\*" "$out/ctest.txt" | head -8
timeout 240 build-gpu/bench/loom_bench \
  --benchmark_filter='grouped_gemm/bf16/qwen3_30b_a3b/(gate_up|down)_(fwd|dgrad)(_nf4)?/(sm90|sm90_wide|sm90_tma)(/|$)|nf4_dequantize_experts/bf16/128x1536x2048/batched' \
  --benchmark_min_time=0.05s --benchmark_out="$out/bench.json" --benchmark_out_format=json > "$out/bench.log" 2>&1
echo "bench: exit $?"
python3 - "$out/bench.json" <<'PY'
import json, sys
rows = {b["name"].replace("/manual_time", ""): b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b["time_unit"]]
        for b in json.load(open(sys.argv[1]))["benchmarks"] if b.get("run_type") == "iteration"}
deq = rows.get("nf4_dequantize_experts/bf16/128x1536x2048/batched")  # gate_up's experts (1536 x 2048)
print(f"dequantising gate_up's 128 experts: {deq} us (down's are half as many elements)")
print(f"{'product':28} {'bf16 us':>9} {'nf4 us':>9} {'bf16 + dequant':>15} {'nf4 / (bf16 + dequant)':>24}")
pre = "grouped_gemm/bf16/qwen3_30b_a3b/"
for proj in ("gate_up", "down"):
    for p in ("fwd", "dgrad"):
        for v in ("sm90", "sm90_wide", "sm90_tma"):
            b, n = rows.get(f"{pre}{proj}_{p}/{v}"), rows.get(f"{pre}{proj}_{p}_nf4/{v}")
            d = None if deq is None else (deq if proj == "gate_up" else deq / 2)
            both = None if b is None or d is None else b + d
            ratio = f"{n / both:.2f}" if n and both else "-"
            print(f"{proj + '_' + p + '/' + v:28} {b or 0:9.1f} {n or 0:9.1f} {both or 0:15.1f} {ratio:>24}")
PY
# PROFILE=1: ncu of the grouped kernel's first launch in each of gate_up's forward with bf16 experts
# and with NF4 experts (128 x 256 tiles; PROFILE_CASES: other benchmark names), with the stall
# reasons: where the bf16 kernel's time goes (about 45 % of the GEMM rate at these shapes) and what the
# NF4 B tiles add. Reports in ncu_N.txt.
if [ "${PROFILE:-0}" = 1 ]; then
  tools/gpu/ncu_cases.sh "$out" 'grouped_gemm_sm90_kernel' ${PROFILE_CASES:-grouped_gemm/bf16/qwen3_30b_a3b/gate_up_fwd/sm90_wide grouped_gemm/bf16/qwen3_30b_a3b/gate_up_fwd_nf4/sm90_wide}
fi
