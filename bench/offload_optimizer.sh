#!/usr/bin/env bash
# What `loom train --offload-optimizer` saves and costs on one GPU, after build-gpu is built: the
# Llama-3.2-1B shape (random bf16 weights), full fine-tuning and LoRA r16, batch 4 x 2048, with and
# without offload; prints mean tokens/s (steps 3..), peak GPU memory and the start line's bytes.
#   bench/offload_optimizer.sh            Env: LOOM_BIN (default build-gpu/tools/loom), STEPS (8)
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
loom=${LOOM_BIN:-build-gpu/tools/loom}
steps=${STEPS:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/cfg"
cat > "$work/cfg/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
 "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true,
 "bos_token_id": 1202, "eos_token_id": 1203, "torch_dtype": "bfloat16"}
JSON
cp examples/demo/model-config/tokenizer.json "$work/cfg/"
"$loom" init --from "$work/cfg" --out "$work/model" --seed 0 > /dev/null || exit 1
for _ in $(seq 1 2000); do cat examples/demo/weaving.jsonl; done > "$work/data.jsonl"
for mode in "--full" "--lora-r 16"; do
  for off in "" "--offload-optimizer"; do
    run="$work/run$(echo "$mode$off" | tr -d ' -')"
    "$loom" train --overwrite --model "$work/model" --data "$work/data.jsonl" --out "$run" --device cuda --dtype bf16 \
      --seq-len 2048 --batch-size 4 --max-steps "$steps" --lr 1e-5 $mode $off --checkpointing recompute \
      --log-every 1000 > "$run.log" 2>&1 || { echo "failed: $mode $off"; tail -5 "$run.log"; continue; }
    python3 - "$run/metrics.jsonl" "$mode $off" "$run.log" <<'PY'
import json, sys
path, what, log = sys.argv[1:]
m = [json.loads(l) for l in open(path)]
tps = sum(x["tokens_per_s"] for x in m[2:]) / max(1, len(m) - 2)
line = next((l.strip() for l in open(log) if "--offload-optimizer:" in l), "")
print(f"{what:32s} {tps:10.0f} tok/s  peak GPU {max(x['mem_bytes'] for x in m) / 2**30:6.2f} GiB  {line}")
PY
  done
done
