#!/usr/bin/env bash
# On a GPU machine with N GPUs (after tools/gpu/gpu_check.sh built build-gpu): full fine-tuning of the
# Llama-3.2-1B shape (vocab 128256, tied, hidden 2048, 16 layers) at batch 4 x 2048 per GPU,
# `mpirun -np N loom train --full --dist ddp` and `--dist zero2` against PyTorch DDP and FSDP2
# (fully_shard, reshard_after_forward=False: ZeRO-2) on the same model and global batch, on N GPUs
# and on one (for the scaling), plus one Loom process training the whole global batch (its per-step
# losses are what every rank count must give). Usage: tools/gpu/gpu_dist_bench.sh [N] (default: every
# visible GPU). One JSON line per run in $OUT/dist_bench.txt; bench/dist_table.py prints the table
# ($OUT/dist_table.md): tokens/s, scaling, peak memory and optimizer memory per GPU, ZeRO-2 against
# FSDP2, the loss differences.
# Env: LOOM_DIST_STEPS (20), LOOM_DIST_LORA=1 adds LoRA and QLoRA (r16, seven projections) of the
# Llama-3-8B shape with --dist ddp on N GPUs and on one; LOOM_DIST_PEERS (default "ddp fsdp2"; " "
# for none). To check the script without GPUs: LOOM_DIST_DEVICE=cpu LOOM_DIST_MODEL=<small model>
# LOOM_DIST_PEERS=" " LOOM_DIST_SEQ=64 LOOM_DIST_BATCH=2 LOOM_DIST_DTYPE=f32 LOOM_BIN=build/tools/loom.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
device=${LOOM_DIST_DEVICE:-cuda}
if [ -n "${1:-}" ]; then n=$1; elif [ "$device" = cuda ]; then n=$(nvidia-smi -L | wc -l); else n=2; fi
out=${OUT:-gpu-out}
mkdir -p "$out"
steps=${LOOM_DIST_STEPS:-20}
seq=${LOOM_DIST_SEQ:-2048} batch=${LOOM_DIST_BATCH:-4} dtype=${LOOM_DIST_DTYPE:-bf16}
loom=${LOOM_BIN:-build-gpu/tools/loom}
peers=${LOOM_DIST_PEERS-ddp fsdp2}
mpi_extra=()
if [ "$device" = cpu ]; then mpi_extra=(--oversubscribe -x OMP_NUM_THREADS=1); fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
model=${LOOM_DIST_MODEL:-}
if [ -z "$model" ]; then
  mkdir -p "$work/cfg"
  cat > "$work/cfg/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
 "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true,
 "bos_token_id": 1202, "eos_token_id": 1203, "torch_dtype": "bfloat16"}
JSON
  cp examples/demo/model-config/tokenizer.json "$work/cfg/"
  "$loom" init --from "$work/cfg" --out "$work/model" --seed 0 > /dev/null || exit 1
  model=$work/model
fi
# One long document, every row a plain causal piece of it, as PyTorch's rows of random ids (the
# short demo paragraphs packed would give Loom a document mask that skips most of the attention).
python3 bench/e2e/long_document.py "$work/data.jsonl" $((1500 * (n + 3) / 4)) || exit 1
: > "$out/dist_bench.txt"
common=(--data "$work/data.jsonl" --device "$device" --dtype "$dtype" --seq-len "$seq" --max-steps "$steps")

# summarize METRICS NAME WORLD TAG DIST_LINE [reference]: one JSON line (median tokens/s after a
# warm-up of up to 5 steps, rank 0's peak memory, the optimizer state + f32 masters per rank that
# `loom dist:` printed, every step's loss).
summarize() {
  python3 - "$@" <<'PY' | tee -a "$out/dist_bench.txt"
import json, re, statistics, sys
path, who, world, tag, dist_line = sys.argv[1:6]
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
if not rows:
    print(json.dumps({"loom": who, "world": int(world), "tag": tag, "ok": False}))
    sys.exit()
timed = rows[min(5, len(rows) // 2):]
line = {"loom": who, "world": int(world), "tag": tag,
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
        "peak_mem_bytes_rank0": max(r["mem_bytes"] for r in timed), "losses": [r["loss"] for r in rows]}
m = re.search(r"optimizer state \+ f32 masters ([0-9.]+) MiB per rank", dist_line)
if m:
    line["optimizer_mib_per_rank"] = float(m.group(1))
if len(sys.argv) > 6:  # the one-process run with the global batch of a world of `world`
    line = {"loom": who, "reference": True, "world_of": int(world), "tag": tag, "losses": line["losses"],
            "tokens_per_s": line["tokens_per_s"], "world": 1}
print(json.dumps(line))
PY
}

# loom_dist NP MODEL TAG FLAGS...: `mpirun -np NP loom train FLAGS` with batch $batch per rank.
loom_dist() {
  local np=$1 model=$2 tag=$3 run
  shift 3
  run="$work/run-$tag-$np-${*//[ -]/}"
  mpirun -np "$np" --bind-to none "${mpi_extra[@]}" "$loom" train --overwrite --model "$model" --out "$run" "${common[@]}" \
    --batch-size "$batch" "$@" > "$run.log" 2>&1
  summarize "$run/metrics.jsonl" "loom train $*" "$np" "$tag" "$(grep -h "loom dist:" "$run.log")"
}

# loom_whole NP MODEL TAG FLAGS...: one process, no --dist, training the global batch of NP ranks.
loom_whole() {
  local np=$1 model=$2 tag=$3 run ckpt=()
  shift 3
  run="$work/whole-$tag-$np"
  [ "$device" = cuda ] && ckpt=(--checkpointing recompute)  # the global batch of 8 ranks, in one GPU
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$loom" train --overwrite --model "$model" --out "$run" "${common[@]}" \
    --batch-size $((batch * np)) "${ckpt[@]}" "$@" > "$run.log" 2>&1
  summarize "$run/metrics.jsonl" "loom train --batch-size $((batch * np))${ckpt[*]:+ ${ckpt[*]}} $*" "$np" "$tag" "" reference
}

worlds=$(printf '%s\n' 1 "$n" | sort -un)
for np in $worlds; do
  for mode in ddp zero2; do loom_dist "$np" "$model" full --full --lr 1e-5 --dist "$mode"; done
done
loom_whole "$n" "$model" full --full --lr 1e-5
# LOOM_DIST_LORA=1: LoRA and QLoRA (r16, seven projections) of the Llama-3-8B shape with --dist ddp on
# N GPUs and on one (the scaling: N-GPU tokens/s over N x one-GPU tokens/s).
if [ "${LOOM_DIST_LORA:-0}" = 1 ] && [ -f "$work/cfg/config.json" ]; then  # (not with LOOM_DIST_MODEL)
  mkdir -p "$work/cfg8b"
  sed -e 's/"hidden_size": 2048/"hidden_size": 4096/' -e 's/"intermediate_size": 8192/"intermediate_size": 14336/' \
      -e 's/"num_hidden_layers": 16/"num_hidden_layers": 32/' -e 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' \
      "$work/cfg/config.json" > "$work/cfg8b/config.json"
  cp "$work/cfg/tokenizer.json" "$work/cfg8b/"
  "$loom" init --from "$work/cfg8b" --out "$work/model8b" --seed 0 > /dev/null
  for np in $worlds; do
    loom_dist "$np" "$work/model8b" lora8b --lora-r 16 --lora-alpha 16 --lr 2e-4 --dist ddp
    loom_dist "$np" "$work/model8b" qlora8b --qlora --lora-r 16 --lora-alpha 16 --lr 2e-4 --dist ddp
  done
fi
for np in $worlds; do
  for mode in $peers; do
    torchrun --standalone --nproc-per-node "$np" bench/dist_peer.py "$model" --mode "$mode" --seq-len "$seq" \
      --batch-size "$batch" --steps "$steps" 2>&1 | grep '^{' | tee -a "$out/dist_bench.txt"
  done
done
python3 bench/dist_table.py "$out/dist_bench.txt" | tee "$out/dist_table.md"
rm -rf "$work"
