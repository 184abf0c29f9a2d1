#!/usr/bin/env bash
# On a GPU machine with N GPUs (after tools/gpu_check.sh built build-gpu): full fine-tuning of the
# Llama-3.2-1B shape (vocab 128256, tied, hidden 2048, 16 layers) at batch 4 x 2048 per GPU,
# `mpirun -np N loom train --full --dist ddp` and `--dist zero2` against PyTorch DDP and FSDP2
# (fully_shard, reshard_after_forward=False: ZeRO-2) on the same model, same global batch, same
# run. Usage: tools/gpu_dist_bench.sh [N] (default: every visible GPU). Prints one JSON line per
# system: global tokens/s and peak memory per GPU; writes $OUT/dist_bench.txt. LOOM_DIST_LORA=1 adds
# LoRA and QLoRA of the Llama-3-8B shape with --dist ddp on N GPUs and on one (below).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
n=${1:-$(nvidia-smi -L | wc -l)}
out=${OUT:-gpu-out}
mkdir -p "$out"
steps=${LOOM_DIST_STEPS:-20}
seq=2048 batch=4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
mkdir -p "$work/cfg"
cat > "$work/cfg/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
 "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true,
 "bos_token_id": 1202, "eos_token_id": 1203, "torch_dtype": "bfloat16"}
JSON
cp examples/demo/model-config/tokenizer.json "$work/cfg/"
build-gpu/tools/loom init --from "$work/cfg" --out "$work/model" --seed 0 > /dev/null
# One long document, every row a plain causal piece of it, as PyTorch's rows of random ids (the
# short demo paragraphs packed would give Loom a document mask that skips most of the attention).
python3 bench/e2e/long_document.py "$work/data.jsonl" $((1500 * (n + 3) / 4)) || exit 1
: > "$out/dist_bench.txt"
# loom_dist NP MODEL TAG FLAGS...: `mpirun -np NP loom train FLAGS`, one JSON line (median tokens/s
# after 5 warm-up steps, rank 0's peak GPU memory, the last loss).
loom_dist() {
  local np=$1 model=$2 tag=$3
  shift 3
  mpirun -np "$np" --bind-to none build-gpu/tools/loom train --model "$model" --data "$work/data.jsonl" \
    --out "$work/run-$tag-$np" --device cuda --dtype bf16 --seq-len $seq --batch-size $batch \
    --max-steps "$steps" "$@" 2>&1 | grep "loom dist:"
  python3 - "$work/run-$tag-$np/metrics.jsonl" "loom train $*" "$np" <<'PY' | tee -a "$out/dist_bench.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]
print(json.dumps({"loom": sys.argv[2], "world": int(sys.argv[3]),
                  "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
                  "peak_mem_bytes_rank0": max(r["mem_bytes"] for r in rows), "loss": rows[-1]["loss"]}))
PY
}
for mode in ddp zero2; do loom_dist "$n" "$work/model" "full-$mode" --full --lr 1e-5 --dist "$mode"; done
# LOOM_DIST_LORA=1: LoRA and QLoRA (r16, seven projections) of the Llama-3-8B shape with --dist ddp on
# N GPUs and on one (the scaling: N-GPU tokens/s over N x one-GPU tokens/s).
if [ "${LOOM_DIST_LORA:-0}" = 1 ]; then
  mkdir -p "$work/cfg8b"
  sed -e 's/"hidden_size": 2048/"hidden_size": 4096/' -e 's/"intermediate_size": 8192/"intermediate_size": 14336/' \
      -e 's/"num_hidden_layers": 16/"num_hidden_layers": 32/' -e 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' \
      "$work/cfg/config.json" > "$work/cfg8b/config.json"
  cp "$work/cfg/tokenizer.json" "$work/cfg8b/"
  build-gpu/tools/loom init --from "$work/cfg8b" --out "$work/model8b" --seed 0 > /dev/null
  for np in 1 "$n"; do
    loom_dist "$np" "$work/model8b" "lora8b" --lora-r 16 --lora-alpha 16 --lr 2e-4 --dist ddp
    loom_dist "$np" "$work/model8b" "qlora8b" --qlora --lora-r 16 --lora-alpha 16 --lr 2e-4 --dist ddp
  done
fi
for mode in ddp fsdp2; do
  torchrun --standalone --nproc-per-node "$n" bench/dist_peer.py "$work/model" --mode $mode --seq-len $seq \
    --batch-size $batch --steps "$steps" 2>&1 | grep '^{' | tee -a "$out/dist_bench.txt"
done
rm -rf "$work"
