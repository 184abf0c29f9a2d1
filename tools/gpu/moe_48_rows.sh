#!/usr/bin/env bash
# On an H200 (nvidia-h200 with needs_h200: transformers' 48-layer base in memory is about 90 GB), with the
# prebuilt binaries: issue 33's rows at the whole shapes not yet measured on an H200, each peer in the call of
# its Loom row, batch 4 x 2048 (bench/e2e/moe.sh's table, MFU over the active parameters):
#   unsloth  Qwen3-30B-A3B 48 layers, Loom QLoRA recompute, then Unsloth 2026.10.9's QLoRA MoE path (it reads
#            the 61 GB bf16 folder, written first: about 180 s); session 42's H100 had Loom at 0.96x
#   peft     the same shape, Loom LoRA recompute, then transformers 5.17 + PEFT with gradient checkpointing
#            (grouped_mm experts, base in memory; out of memory on the H100)
#   bnb      the same shape, Loom QLoRA recompute, then transformers + PEFT + bitsandbytes with gradient
#            checkpointing, base in memory and quantised there (tools/check/check_bnb_in_memory.py: the same
#            bits as from_pretrained from a folder)
#   mixtral  Mixtral-8x7B (32 layers), Loom QLoRA recompute, then bnb-gc in memory (its 93 GB folder fits no
#            disk there, so no Unsloth row: Unsloth loads from a folder)
# MOE48_PARTS picks and orders them (unset: "unsloth peft bnb mixtral"; empty: none); a part starts only while the call has
# the time it needs (MOE48_LIMIT, default 560 s). Results: $OUT/moe.jsonl, $OUT/moe_table.md, $OUT/logs.tgz;
# LOOM_MOE_PREVIOUS=<an earlier call's moe.jsonl> carries its rows into this call's table.
#   export OUT; tools/gpu/moe_48_rows.sh        (carry .devdeps, .prebuilt and .peers)
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-moe48-out}; mkdir -p "$OUT"; [ -f .devdeps/env.sh ] && source .devdeps/env.sh
T0=$(date +%s); LIMIT=${MOE48_LIMIT:-560}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
el() { echo "[t=$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w48; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
tools/gpu/build.sh loom > $W/build.log 2>&1; tail -1 $W/build.log; el
[ -n "${LOOM_MOE_PREVIOUS:-}" ] && [ -f "$LOOM_MOE_PREVIOUS" ] && cp "$LOOM_MOE_PREVIOUS" $OUT/moe.jsonl
touch $OUT/moe.jsonl
export LOOM_MOE_EXPERTS=grouped_mm LOOM_MOE_PREVIOUS=$OUT/moe.jsonl LOOM_MOE_RUN_TIMEOUT=150
export LOOM_E2E_CACHE=${LOOM_E2E_CACHE:-/tmp/loom-e2e}
# m NEED SHAPE VAR=... : one moe.sh run when the call has NEED seconds left; its peer gets what remains less a margin.
m() {
  local need=$1 shape=$2; shift 2
  [ "$(left)" -gt "$need" ] || { echo "skipped (time): $shape $*"; return; }
  env LOOM_MOE_MODES=" " LOOM_MOE_QLORA_MODES=" " "$@" LOOM_MOE_PEER_TIMEOUT=$(( $(left) - 30 )) \
    bash bench/e2e/moe.sh "$shape" >> $W/moe.log 2>&1
  tail -2 $OUT/moe.jsonl | cut -c1-300; el
}
for part in ${MOE48_PARTS-unsloth peft bnb mixtral}; do
  case $part in
    unsloth) m 250 qwen3moe30b LOOM_MOE_LAYERS=48 LOOM_MOE_QLORA_MODES=recompute LOOM_MOE_PEERS=unsloth-qlora ;;
    peft) m 200 qwen3moe30b LOOM_MOE_LAYERS=48 LOOM_MOE_MODES=recompute LOOM_MOE_PEERS=peft-gc ;;
    bnb) m 200 qwen3moe30b LOOM_MOE_LAYERS=48 LOOM_MOE_QLORA_MODES=recompute LOOM_MOE_PEERS=bnb-gc ;;
    mixtral) m 200 mixtral8x7b LOOM_MOE_QLORA_MODES=recompute LOOM_MOE_PEERS=bnb-gc ;;
    *) echo "moe_48_rows: unknown part $part (unsloth, peft, bnb, mixtral)" ;;
  esac
done
tail -30 $OUT/moe_table.md 2>/dev/null
tar -C $W -czf $OUT/logs.tgz . ; ls $OUT
