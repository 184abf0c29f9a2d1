#!/usr/bin/env bash
# On the GPU machine: ncu of the first launch of kernels matching KERNEL_REGEX in each named loom_bench
# case (one ncu run a case, 150 s each at most), with speed of light, warp stall reasons, tensor pipe
# and L2 figures; reports in OUTDIR/ncu_N.txt, a summary on stdout.
#   tools/gpu/ncu_cases.sh OUTDIR KERNEL_REGEX CASE [CASE ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$1 kernels=$2
shift 2
command -v ncu > /dev/null || { echo "ncu_cases: no ncu on this machine"; exit 0; }
n=0
for case in "$@"; do
  n=$((n + 1))
  timeout 150 ncu --clock-control none -k regex:"$kernels" -c 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor_op.*cycles_active\.avg\.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed' \
    build-gpu/bench/loom_bench --benchmark_min_time=0.001 --benchmark_filter="^$case(/|\$)" > "$out/ncu_$n.txt" 2>&1
  echo "== ncu $case (exit $?)"
  grep -E "$kernels|Duration|Throughput|Issue Slots|Eligible|Executed Ipc|pipe_tensor|lts__|stalled" "$out/ncu_$n.txt" |
    grep -v "^==PROF" | awk '!/stalled/ || $NF+0 >= 0.05' | head -45
done
