#!/usr/bin/env bash
# A world of one through NCCL equals the non-distributed CUDA run (label cuda): `loom train` on one
# GPU, then `mpirun -np 1 loom train ... --dist ddp` (NCCL communicator, bucketed all-reduce of a
# single rank), same seed and data; the per-step losses must be equal bit for bit (one rank sums
# nothing). Usage: cuda_world1.sh LOOM_BINARY SOURCE_DIR
set -euo pipefail
loom=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$loom" init --from "$src/examples/demo/model-config" --out "$tmp/base" --seed 3 >/dev/null
args=(train --model "$tmp/base" --data "$src/examples/demo/weaving.jsonl" --seq-len 64 --batch-size 4 --grad-accum 2
      --max-steps 6 --lr 5e-3 --lora-r 8 --lora-dropout 0.1 --device cuda --dtype bf16 --quiet)
"$loom" "${args[@]}" --out "$tmp/plain"
mpirun -np 1 "$loom" "${args[@]}" --out "$tmp/nccl" --dist ddp
python3 - "$tmp/plain/metrics.jsonl" "$tmp/nccl/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
print("plain:", a, "\nnccl: ", b)
sys.exit(0 if len(a) == 6 and a == b else 1)
PY
