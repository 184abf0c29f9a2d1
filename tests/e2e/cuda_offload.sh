#!/usr/bin/env bash
# `loom train --offload-optimizer` on one GPU against the same run without offload (label cuda):
# LoRA and --full, adamw and adamw8bit, bf16, a few steps of the demo model; and ZeRO-2 of a world of
# one through NCCL with and without offload. Tolerance: none — the per-step losses, the adapter or
# model bytes and the checkpoint's optimizer bytes must be equal. The host update runs the CPU AdamW
# and 8-bit AdamW kernels, which equal the CUDA ones bit for bit (no FMA contraction, IEEE sqrt and
# division on both; tests/kernels/test_adamw*_cuda check it), the copies are exact, and a run on one
# GPU is deterministic (dist/cuda_world1.sh relies on that too). It also prints each run's mean
# tokens/s and peak GPU memory (informative only: the model is tiny). Every run also evaluates
# --eval-data after steps 3 and 6 (the eval losses must be equal too).
# Usage: cuda_offload.sh LOOM_BINARY SOURCE_DIR
set -euo pipefail
loom=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$loom" init --from "$src/examples/demo/model-config" --out "$tmp/base" --seed 3 >/dev/null
common=(train --overwrite --model "$tmp/base" --data "$src/examples/demo/weaving.jsonl" --seq-len 64 --batch-size 4 --grad-accum 2
        --max-steps 6 --lr 5e-3 --warmup 2 --weight-decay 0.1 --max-grad-norm 0.5 --device cuda --dtype bf16 --quiet
        --eval-data "$src/examples/demo/weaving.jsonl" --eval-every 3)
fail=0
compare() {  # name plain_dir offload_dir output_file
  python3 - "$1" "$2" "$3" "$4" <<'PY' || fail=1
import json, sys
name, a, b, out = sys.argv[1:]
la, lb = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in (a, b))
ok = len(la) == 6 and [m["loss"] for m in la] == [m["loss"] for m in lb]
# --eval-data on the GPU: evaluated after steps 3 and 6, the same figures with and without offload
evals = [[m.get("eval_loss") for m in l] for l in (la, lb)]
ok = ok and evals[0] == evals[1] and [e is not None for e in evals[0]] == [False, False, True, False, False, True]
diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(la, lb)) if len(la) == len(lb) else float("nan")
for f in (out, "checkpoint-6/optimizer.safetensors"):
    same = open(f"{a}/{f}", "rb").read() == open(f"{b}/{f}", "rb").read()
    ok = ok and same
    print(f"  {f}: {'equal' if same else 'DIFFERENT'}")
tps = lambda l: sum(m["tokens_per_s"] for m in l[1:]) / max(1, len(l) - 1)
mem = lambda l: max(m.get("mem_bytes", 0) for m in l) / 2**20
print(f"{name}: losses {'equal' if ok else 'DIFFER'} (max |diff| {diff:.3g}); "
      f"{tps(la):.0f} -> {tps(lb):.0f} tok/s, peak {mem(la):.1f} -> {mem(lb):.1f} MiB")
sys.exit(0 if ok else 1)
PY
}
run_pair() {  # name output_file flags...
  local name=$1 out=$2
  shift 2
  "$loom" "${common[@]}" "$@" --out "$tmp/$name-plain"
  "$loom" "${common[@]}" "$@" --offload-optimizer --out "$tmp/$name-offload"
  compare "$name" "$tmp/$name-plain" "$tmp/$name-offload" "$out"
}
run_pair lora-adamw adapter_model.safetensors --lora-r 8 --lora-targets q_proj,v_proj,down_proj,lm_head
run_pair lora-adamw8bit adapter_model.safetensors --optim adamw8bit --lora-r 8 --lora-targets q_proj,v_proj,down_proj,lm_head
run_pair full-adamw model.safetensors --full
run_pair full-adamw8bit model.safetensors --full --optim adamw8bit
# ZeRO-2, a world of one through NCCL: the rank offloads its shard.
mpirun -np 1 "$loom" "${common[@]}" --full --dist zero2 --out "$tmp/zero2-plain"
mpirun -np 1 "$loom" "${common[@]}" --full --dist zero2 --offload-optimizer --out "$tmp/zero2-offload"
compare zero2-full "$tmp/zero2-plain" "$tmp/zero2-offload" model.safetensors
exit $fail
