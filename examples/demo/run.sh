#!/usr/bin/env bash
# The quick-start demo: initialise a small Llama-style model (4 layers, 1.4 M parameters), train a
# LoRA adapter on examples/demo/weaving.jsonl (shipped here; nothing is downloaded), show the loss
# falling, then generate from base + adapter.   examples/demo/run.sh [BUILD_DIR] [--device cuda]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
shift || true
loom="$build/tools/loom"
work="$build/demo"
rm -rf "$work"
"$loom" init --from "$here/model-config" --out "$work/base" --seed 0
"$loom" train --model "$work/base" --data "$here/weaving.jsonl" --out "$work/run" \
  --seq-len 128 --batch-size 4 --max-steps 60 --lr 1e-2 --schedule cosine --warmup 4 \
  --lora-r 32 --lora-alpha 64 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head \
  --dtype f32 --save-every 40 --log-every 5 "$@"
echo
echo "metrics: $work/run/metrics.jsonl, loss curve: $work/run/loss.svg, adapter: $work/run"
"$loom" generate --model "$work/base" --adapter "$work/run" --prompt "The loom" --max-new-tokens 40 \
  --temperature 0.5 --seed 1 --dtype f32 "$@"
