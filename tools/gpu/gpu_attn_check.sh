#!/usr/bin/env bash
# On the GPU machine: builds only the attention test and loom_bench, runs the CUDA attention test
# for every flash-kernel variant (LOOM_FLASH_FWD / LOOM_FLASH_BWD), then times each variant on the
# issue's shapes (b4 s2048, 32/8 heads at head_dim 64 and 128, 16/8 at 256) beside PyTorch SDPA.
# Logs and JSON go to ${OUT:-gpu-out}; the last lines printed are the comparison tables.
#   FWD_VARIANTS="0 3 4" BWD_VARIANTS="0 3" FWD_FOR_BWD=3 tools/gpu/gpu_attn_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
fwd_variants=${FWD_VARIANTS:-0 3 4}
bwd_variants=${BWD_VARIANTS:-0 3}
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/build.log"

start=$(date +%s)
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DLOOM_BUILD_BENCH=ON && ninja -C build-gpu kernels_test_wgmma_cuda kernels_test_attention_cuda loom_bench; } >> "$out/build.log" 2>&1
rc=$?
echo "build: exit $rc in $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; fi
test_bin=$(find build-gpu -name kernels_test_attention_cuda -type f -perm -u+x | head -1)
bench_bin=build-gpu/bench/loom_bench

# Correctness: the wgmma building blocks, then the forward test per forward variant and the
# backward test per backward variant.
timeout 60 "$(dirname "$test_bin")/kernels_test_wgmma_cuda" > "$out/test_wgmma.log" 2>&1
echo "test wgmma: exit $? ($(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/test_wgmma.log" | tr '\n' ' '))"
grep -E "Failure|rel_error|Which is|which is" "$out/test_wgmma.log" | head -12
for v in $fwd_variants; do
  LOOM_FLASH_FWD=$v timeout 150 "$test_bin" --gtest_filter='AttentionCuda*Forward*' > "$out/test_fwd$v.log" 2>&1
  echo "test fwd variant $v: exit $? ($(grep -E '^\[  (PASSED|FAILED) ' "$out/test_fwd$v.log" | tr '\n' ' '))"
  grep -E "Failure|rel_error|Expected|which is|b[0-9]+ s[0-9]+" "$out/test_fwd$v.log" | head -12
done
for v in $bwd_variants; do
  LOOM_FLASH_BWD=$v timeout 150 "$test_bin" --gtest_filter='AttentionCuda*Backward*' > "$out/test_bwd$v.log" 2>&1
  echo "test bwd variant $v: exit $? ($(grep -E '^\[  (PASSED|FAILED) ' "$out/test_bwd$v.log" | tr '\n' ' '))"
  grep -E "Failure|rel_error|Expected|which is|b[0-9]+ s[0-9]+" "$out/test_bwd$v.log" | head -12
done

# Timing: the PyTorch peer once, then Loom per variant (fwd cases per forward variant; bwd and
# fwd+bwd per backward variant, with the default forward unless FWD_FOR_BWD is set).
shapes='b4_s2048_h32_kv8_d(64|128)(/|$)|b4_s2048_h16_kv8_d256(/|$)'  # not _doc512; loom's names end in /manual_time
python3 bench/peer_torch.py --out "$out/torch.json" --filter "attention_(fwd|bwd|fwdbwd)/bf16/($shapes)" \
  > "$out/torch.log" 2>&1
echo "peer: exit $?"
for v in $fwd_variants; do
  LOOM_FLASH_FWD=$v timeout 200 "$bench_bin" --benchmark_filter="attention_fwd/bf16/($shapes)" \
    --benchmark_repetitions=3 --benchmark_out="$out/bench_fwd$v.json" --benchmark_out_format=json \
    > "$out/bench_fwd$v.log" 2>&1
  echo "== forward variant $v (exit $?)"
  python3 bench/compare.py "$out/bench_fwd$v.json" "$out/torch.json" | grep -E "attention_fwd/|name"
done
for v in $bwd_variants; do
  LOOM_FLASH_FWD=${FWD_FOR_BWD:-0} LOOM_FLASH_BWD=$v timeout 300 "$bench_bin" \
    --benchmark_filter="attention_(bwd|fwdbwd)/bf16/($shapes)" --benchmark_repetitions=3 \
    --benchmark_out="$out/bench_bwd$v.json" --benchmark_out_format=json > "$out/bench_bwd$v.log" 2>&1
  echo "== backward variant $v, forward ${FWD_FOR_BWD:-0} (exit $?)"
  python3 bench/compare.py "$out/bench_bwd$v.json" "$out/torch.json" | grep -E "attention_(bwd|fwdbwd)/|name"
done

# PROFILE=1: one ncu report per Hopper kernel (first forward and backward launch of the d128 case),
# with the stall reasons; FWD_FOR_BWD / PROFILE_BWD pick the variants.
if [ "${PROFILE:-0}" = 1 ] && command -v ncu > /dev/null; then
  LOOM_FLASH_FWD=${FWD_FOR_BWD:-3} LOOM_FLASH_BWD=${PROFILE_BWD:-3} timeout 300 ncu --clock-control none \
    -k regex:'flash_(fwd|bwd)_sm90' -c 2 --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section ComputeWorkloadAnalysis \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor_op.*cycles_active\.avg\.pct_of_peak_sustained_active' \
    "$bench_bin" --benchmark_filter='attention_fwdbwd/bf16/b4_s2048_h32_kv8_d128(/|$)' \
    > "$out/ncu.txt" 2>&1
  echo "== ncu (exit $?)"
  grep -E "flash_|Duration|Throughput|Issue Slots|Eligible|Active Warps|Achieved Occupancy|Executed Ipc|pipe_tensor|stalled" \
    "$out/ncu.txt" | grep -v "^==PROF" | awk '!/stalled/ || $NF+0 >= 0.05' | head -90
fi
