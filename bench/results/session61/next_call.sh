#!/usr/bin/env bash
# Session 61's device call: the dQ hand-over variant (its tests and the A/B against the tree), then the
# 1B scoreboard row against Unsloth (MODES, default none; UNSLOTH, default lora-nogc; LIMIT s, default 420).
# Here first:  tools/gpu/variant_archive.sh dqlate bench/results/session61/bwd_dq_handover_after_dk.diff
# There (carry .devdeps .prebuilt .peers scratch/variants/dqlate.tar.xz):
#   bash bench/results/session61/next_call.sh
set -u
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .devdeps/env.sh; source tools/gpu/prebuilt.sh
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 )) s] $*"; }
CTEST_R='AttentionCuda|FlashKernels|NanPropagationCuda' VARS="dqlate" ROUNDS=2 \
  FILTER='^attention_(bwd|fwdbwd)/bf16/(b4_s2048_h32_kv8_d(64|128)|b1_s8192_h32_kv8_d128)/' \
  OUT=$OUT/ab tools/gpu/variant_call.sh 2>&1 | grep -v "^\s*$" | tail -25
el ab
OUT=$OUT/e2e LOOM_E2E_MODES="${MODES:-none}" LOOM_E2E_PEERS=unsloth LOOM_E2E_UNSLOTH="${UNSLOTH:-lora-nogc}" timeout $(( ${LIMIT:-420} - ($(date +%s) - T0) )) bench/e2e/run.sh 1b > /tmp/e2e.log 2>&1
echo "e2e exit $?"; tail -22 /tmp/e2e.log | cut -c1-200
el e2e
