#!/usr/bin/env bash
# On the GPU machine: builds only the attention tests and loom_bench, runs the CUDA attention tests
# (the dispatcher's kernels and every flash kernel by name), then times each flash kernel by name
# (flash_fwd/<kernel>, flash_bwd/<kernel>) and the dispatcher's choice on the issue's shapes (b4
# s2048, 32/8 heads at head_dim 64 and 128, 16/8 at 256; windows: b1 s8192 d128 w4096 and Gemma 3's
# sliding layers, b4 s2048 8/4 heads d256 w1024) beside PyTorch SDPA.
# Logs and JSON go to ${OUT:-gpu-out}; the last lines printed are the comparison tables.
#   tools/gpu/gpu_attn_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/build.log"

BUILD_LOG="$out/build.log" tools/gpu/build.sh kernels_test_wgmma_cuda kernels_test_attention_cuda \
  kernels_test_nan_propagation_cuda loom_bench || exit 1
test_bin=$(find build-gpu -name kernels_test_attention_cuda -type f -perm -u+x | head -1)
bench_bin=build-gpu/bench/loom_bench

# Correctness: the wgmma building blocks, then the attention tests (FlashKernels runs each kernel
# by name on every case it applies to) and NaN propagation through each kernel.
timeout 60 "$(dirname "$test_bin")/kernels_test_wgmma_cuda" > "$out/test_wgmma.log" 2>&1
echo "test wgmma: exit $? ($(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/test_wgmma.log" | tr '\n' ' '))"
grep -E "Failure|rel_error|Which is|which is" "$out/test_wgmma.log" | head -12
timeout 400 "$test_bin" > "$out/test_attention.log" 2>&1
echo "test attention: exit $? ($(grep -E '^\[  (PASSED|FAILED) ' "$out/test_attention.log" | tr '\n' ' '))"
grep -E "^flash kernel|Failure|rel_error|Expected|which is|b[0-9]+ s[0-9]+" "$out/test_attention.log" | head -20
timeout 120 "$(dirname "$test_bin")/kernels_test_nan_propagation_cuda" --gtest_filter='*Attention*' > "$out/test_nan.log" 2>&1
echo "test nan: exit $? ($(grep -E '^\[  (PASSED|FAILED) ' "$out/test_nan.log" | tr '\n' ' '))"
grep -E "Failure|kernel|Expected" "$out/test_nan.log" | head -12

# Timing: the PyTorch peer once, then Loom: the dispatcher's kernels under the peer's names, and
# each kernel by name (compare.py lists those without a peer).
shapes='b4_s2048_h32_kv8_d(64|128)(/|$)|b4_s2048_h16_kv8_d256(/|$)|b1_s8192_h32_kv8_d128_w4096|b4_s2048_h8_kv4_d256_w1024'  # not _doc512; loom's names end in /manual_time
python3 bench/peer_torch.py --out "$out/torch.json" --filter "attention_(fwd|bwd|fwdbwd)/bf16/($shapes)" \
  > "$out/torch.log" 2>&1
echo "peer: exit $?"
timeout 500 "$bench_bin" --benchmark_filter="(attention_(fwd|bwd|fwdbwd)|flash_(fwd|bwd)/[a-z0-9_]+)/bf16/($shapes)" \
  --benchmark_repetitions=3 --benchmark_out="$out/bench_attn.json" --benchmark_out_format=json > "$out/bench_attn.log" 2>&1
echo "== attention (exit $?)"
python3 bench/compare.py "$out/bench_attn.json" "$out/torch.json" | grep -E "attention_(fwd|bwd|fwdbwd)/|flash_|name"

# PROFILE=1: one ncu report per Hopper kernel (first forward and backward launch of the d128 case,
# or PROFILE_CASE's), with the stall reasons.
if [ "${PROFILE:-0}" = 1 ] && command -v ncu > /dev/null; then
  timeout 300 ncu --clock-control none \
    -k regex:'flash_(fwd|bwd)_sm90' -c 2 --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section ComputeWorkloadAnalysis \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor_op.*cycles_active\.avg\.pct_of_peak_sustained_active' \
    "$bench_bin" --benchmark_filter="${PROFILE_CASE:-attention_fwdbwd/bf16/b4_s2048_h32_kv8_d128(/|\$)}" \
    > "$out/ncu.txt" 2>&1
  echo "== ncu (exit $?)"
  grep -E "flash_|Duration|Throughput|Issue Slots|Eligible|Active Warps|Achieved Occupancy|Executed Ipc|pipe_tensor|stalled" \
    "$out/ncu.txt" | grep -v "^==PROF" | awk '!/stalled/ || $NF+0 >= 0.05' | head -90
fi
