#!/usr/bin/env bash
# On the GPU machine: runs a command under Nsight Compute collecting only each kernel's duration
# (no cache flush, no clock locking, so kernels run as they do unprofiled, one at a time), then
# prints where the time went, kernel by kernel (tools/gpu/kernel_profile.py). The GPU machine has ncu
# but no nsys; this is the per-kernel breakdown of a training step.
#   STEPS=2 tools/gpu/kernel_profile.sh OUT.csv build-gpu/tools/loom train ... --max-steps 2
# STEPS divides the totals (per-step figures); SKIP leaves out the first SKIP steps (load and warm-up:
# STEPS then counts the rest); TOP (default 40) rows are printed.
set -uo pipefail
csv=$1
shift
ncu --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none --target-processes all \
  --log-file "$csv" "$@" > /dev/null
rc=$?
[ $rc -ne 0 ] && echo "kernel_profile: the profiled command exited $rc"
python3 "$(dirname "$0")/kernel_profile.py" "$csv" --steps "${STEPS:-1}" --skip-steps "${SKIP:-0}" --top "${TOP:-40}"
