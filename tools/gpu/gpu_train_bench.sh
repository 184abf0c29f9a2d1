#!/usr/bin/env bash
# On the GPU machine (after tools/gpu/gpu_check.sh built build-gpu): LoRA training throughput of
# `loom train` against transformers + PEFT on the same randomly initialised Llama-style model,
# bf16, LoRA r16 on all seven projections. LOOM_TRAIN_SHAPE picks the model and batch:
#   small (default): hidden 2048, 16 layers, 32/8 heads, vocab 32000, untied; seq 512 x batch 8
#   1b: the Llama-3.2-1B shape (vocab 128256, tied); seq 2048 x batch 8 (the issues' table)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-gpu-out}
work=$(mktemp -d)
mkdir -p "$work/cfg"
shape=${LOOM_TRAIN_SHAPE:-small}
if [ "$shape" = 1b ]; then vocab=128256 tied=true seq=2048 batch=8 reps=2000; else vocab=32000 tied=false seq=512 batch=8 reps=150; fi
steps=${LOOM_TRAIN_STEPS:-30}
cat > "$work/cfg/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": $vocab, "hidden_size": 2048,
 "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": $tied,
 "bos_token_id": 1202, "eos_token_id": 1203, "torch_dtype": "bfloat16"}
JSON
cp examples/demo/model-config/tokenizer.json "$work/cfg/"
build-gpu/tools/loom init --from "$work/cfg" --out "$work/model" --seed 0 > /dev/null
# Enough text for batch x seq x steps tokens: the demo paragraphs repeated.
for i in $(seq 1 $reps); do cat examples/demo/weaving.jsonl; done > "$work/data.jsonl"
build-gpu/tools/loom train --overwrite --model "$work/model" --data "$work/data.jsonl" --out "$work/run" --device cuda \
  --dtype bf16 --seq-len $seq --batch-size $batch --max-steps $steps --lora-r 16 --lora-alpha 16 --lr 2e-4 --quiet
python3 - "$work/run/metrics.jsonl" <<'PY' | tee "$out/train_bench.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]
print(json.dumps({"loom": "loom train (LoRA r16, bf16)", "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
                  "peak_mem_bytes": max(r["mem_bytes"] for r in rows), "loss": rows[-1]["loss"]}))
PY
python3 bench/train_peer.py "$work/model" --seq-len $seq --batch-size $batch --steps $steps 2>&1 | tail -1 | tee -a "$out/train_bench.txt"
rm -rf "$work"
