#!/usr/bin/env bash
# On an H200 (nvidia-h200, needs_h200: the transformers + PEFT row draws its 48-layer base in memory,
# about 90 GB), one device call of about 550 s with the prebuilt binaries: issue 33's rows at the whole
# Qwen3-30B-A3B shape (48 layers, batch 4 x 2048) not yet measured on an H200, every peer in this call:
#   1. Loom LoRA --checkpointing recompute, then transformers 5.17 + PEFT with gradient checkpointing
#      (grouped_mm experts, base drawn in memory; out of memory on an H100 in session 42);
#   2. Loom QLoRA recompute, then Unsloth 2026.10.9's QLoRA MoE path (it reads the 61 GB bf16 folder,
#      written first: about 180 s), then Unsloth LoRA if the call has time left.
# The table is bench/e2e/moe.sh's (tokens/s, framework and nvidia-smi GiB, MFU, ratios), in
# $OUT/moe_table.md; raw lines in $OUT/moe.jsonl; logs in $OUT/logs.tgz.
#   export OUT; tools/gpu/moe_48_rows.sh     (carry .devdeps, .prebuilt and .peers; MOE48_LIMIT, default 560)
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-moe48-out}; mkdir -p "$OUT"; [ -f .devdeps/env.sh ] && source .devdeps/env.sh
T0=$(date +%s); LIMIT=${MOE48_LIMIT:-560}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
el() { echo "[t=$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w48; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
tools/gpu/build.sh loom > $W/build.log 2>&1; tail -1 $W/build.log; el
export LOOM_MOE_LAYERS=48 LOOM_MOE_EXPERTS=grouped_mm LOOM_MOE_PREVIOUS=$OUT/moe.jsonl LOOM_MOE_RUN_TIMEOUT=150
export LOOM_E2E_CACHE=${LOOM_E2E_CACHE:-/tmp/loom-e2e}
touch $OUT/moe.jsonl
# m NEED VAR=... : one moe.sh run when the call has NEED seconds left; its peer gets what remains less a margin.
m() {
  local need=$1; shift
  [ "$(left)" -gt "$need" ] || { echo "skipped (time): $*"; return; }
  env "$@" LOOM_MOE_PEER_TIMEOUT=$(( $(left) - 30 )) bash bench/e2e/moe.sh qwen3moe30b >> $W/moe.log 2>&1
  tail -2 $OUT/moe.jsonl | cut -c1-300; el
}
m 200 LOOM_MOE_MODES=recompute LOOM_MOE_QLORA_MODES=" " LOOM_MOE_PEERS=peft-gc
m 250 LOOM_MOE_MODES=" " LOOM_MOE_QLORA_MODES=recompute LOOM_MOE_PEERS=unsloth-qlora
m 120 LOOM_MOE_MODES=" " LOOM_MOE_QLORA_MODES=" " LOOM_MOE_PEERS=unsloth
tail -30 $OUT/moe_table.md 2>/dev/null
tar -C $W -czf $OUT/logs.tgz . ; ls $OUT
