#!/usr/bin/env bash
# The preference-training benchmark, on the GPU machine after build-gpu is built: `loom train
# --objective dpo` (LoRA r16 on every projection, bf16, beta 0.1, the reference = the model with its
# adapters off) in each --checkpointing mode, with and without --precompute-ref, against TRL 1.15's
# DPOTrainer + PEFT (sdpa; with and without gradient checkpointing; precompute_ref_log_probs) and
# Unsloth 2026.10.9's patched DPOTrainer (bench/e2e/dpo_peer.py) — the same random-init weights
# (bench/e2e/model.sh), the same pairs (bench/e2e/preference_pairs.py: PAIRS lines of about 600
# prompt and 300 completion words, ~1,700 tokens a sequence), the same pairs a micro-batch and
# max length. Prints one table (pairs/s, peak GPU memory, ratios) and writes every raw JSON line to
# $OUT/dpo.jsonl.
#   bench/e2e/dpo.sh [1b|8b ...]   (default: 1b; pairs a micro-batch: 4 on 1b, 2 on 8b)
# Env: LOOM_DPO_MODES (default "none recompute offload"), LOOM_DPO_PRECOMPUTE (the modes run again
# with --precompute-ref, default "none"), LOOM_DPO_PEERS (dpo_peer.py modes, default "trl trl-gc
# trl-precompute unsloth unsloth-nogc"; .peers must have been carried for unsloth), LOOM_DPO_STEPS
# (default 10; the first quarter is warm-up), LOOM_DPO_PAIRS (default 200), LOOM_DPO_PROMPT and
# LOOM_DPO_COMPLETION (words, or a range "LO-HI" each pair draws from; default 600 and 300),
# LOOM_DPO_PAD (the modes run again with --pair-layout pad, one sequence a row, default none: loom
# packs a batch's sequences into rows by default), LOOM_DPO_PREVIOUS (a dpo.jsonl of an earlier call
# whose lines open this one's table).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-dpo-out}
mkdir -p "$out"
results="$out/dpo.jsonl"
if [ -n "${LOOM_DPO_PREVIOUS:-}" ]; then cp "$LOOM_DPO_PREVIOUS" "$results" || exit 1; fi
loom=${LOOM_BIN:-build-gpu/tools/loom}
steps=${LOOM_DPO_STEPS:-10}
work=$(mktemp -d)
source bench/e2e/model.sh  # model_dir 1b|8b
pairs="$work/pairs.jsonl"
python3 bench/e2e/preference_pairs.py "$pairs" "${LOOM_DPO_PAIRS:-200}" "${LOOM_DPO_PROMPT:-600}" "${LOOM_DPO_COMPLETION:-300}" || exit 1
if [ -d .peers ] && [ ! -d /tmp/site/unsloth ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/*.whl > "$work/pip.log" 2>&1
fi

loom_run() {  # shape mode batch [extra flags] -> one JSON line
  local shape=$1 mode=$2 batch=$3 extra=${4:-} m run
  m=$(model_dir "$shape") || return 1
  run="$work/run-$shape-$mode${extra// /}"
  timeout "${LOOM_DPO_RUN_TIMEOUT:-300}" "$loom" train --overwrite --model "$m" --data "$pairs" --out "$run" --device cuda \
    --dtype bf16 --objective dpo --beta 0.1 --seq-len 2048 --batch-size "$batch" --max-steps "$steps" --lora-r 16 \
    --lora-alpha 16 --lr 1e-5 --checkpointing "$mode" $extra > "$run.log" 2>&1
  python3 - "$run/metrics.jsonl" "$shape" "$mode" "$batch" "$?" "$run.log" "$extra" <<'PY'
import json, re, statistics, sys
path, shape, mode, batch, rc, log, extra = sys.argv[1:]
who = f"loom {extra + ' ' if extra else ''}--checkpointing {mode}"
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
text = open(log).read()
if rc != "0" or len(rows) < 3:
    tail = text.strip().splitlines()[-1:]
    print(json.dumps({"shape": shape, "who": who, "batch": int(batch), "ok": False, "error": (tail[0] if tail else f"exit {rc}")[:300]}))
    sys.exit()
timed = rows[max(1, len(rows) // 4):]
step_s = statistics.median(r["input_tokens"] / r["tokens_per_s"] for r in timed)
pre = re.search(r"scored (\d+) pairs in ([0-9.]+) s", text)
print(json.dumps({"shape": shape, "who": who, "batch": int(batch), "ok": True, "pairs_s": round(int(batch) / step_s, 2),
                  "tok_s": round(statistics.median(r["tokens_per_s"] for r in timed)),
                  "peak_GiB": round(max(r["mem_bytes"] for r in rows) / 2**30, 2), "loss": rows[-1]["loss"],
                  "accuracy": rows[-1].get("rewards/accuracies"),
                  **({"precompute_s": float(pre.group(2)), "precompute_pairs": int(pre.group(1))} if pre else {})}))
PY
}

for shape in ${@:-1b}; do
  if [ "$shape" = 1b ]; then batch=4; else batch=2; fi
  for mode in ${LOOM_DPO_MODES-none recompute offload}; do loom_run "$shape" "$mode" "$batch" | tee -a "$results"; done
  for mode in ${LOOM_DPO_PRECOMPUTE-none}; do loom_run "$shape" "$mode" "$batch" --precompute-ref | tee -a "$results"; done
  for mode in ${LOOM_DPO_PAD-}; do loom_run "$shape" "$mode" "$batch" "--pair-layout pad" | tee -a "$results"; done
  peer_modes=${LOOM_DPO_PEERS-trl trl-gc trl-precompute unsloth unsloth-nogc}
  if [ -n "${peer_modes// /}" ]; then
    BENCH_WARMUP=3 BENCH_STEPS=$((steps > 4 ? steps - 3 : 2)) PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
      python3 bench/e2e/dpo_peer.py "$(model_dir "$shape")" "$shape" "$pairs" "$batch" 2048 $peer_modes 2>> "$out/peer.err" |
      python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l); r['shape'] = '$shape'; r['who'] = r.pop('mode').split('-dpo-')[-1]; print(json.dumps(r), flush=True)" |
      tee -a "$results"
  fi
done

python3 - "$results" <<'PY'
import json, sys
# Like for like: each loom mode against the peers' runs that keep as little (TRL's gradient checkpointing
# keeps each layer's input on the GPU as loom's recompute does; Unsloth's "unsloth" checkpointing moves
# it to host memory as loom's offload does, so both loom modes are set against it).
PEERS = {"none": ("trl", "unsloth-nogc"), "recompute": ("trl-gc", "unsloth"), "offload": ("trl-gc", "unsloth"),
         "precompute": ("trl-precompute", None)}
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for shape in dict.fromkeys(r["shape"] for r in rows):
    mine = [r for r in rows if r["shape"] == shape]
    ok = {r["who"]: r for r in mine if r.get("ok")}
    print(f"\n{shape}: DPO, LoRA r16, bf16, {mine[0].get('batch', '?')} pairs a micro-batch, max length 2048")
    print(f"{'run':<44} {'pairs/s':>8} {'peak GiB':>9}   {'vs TRL (speed, memory)':<30} {'vs Unsloth (speed, memory)':<30}")
    for r in mine:
        if not r.get("ok"):
            print(f"{r['who']:<44} failed: {r.get('error', '')[:90]}")
            continue
        vs = ["", ""]
        if r["who"].startswith("loom"):
            mode = "precompute" if "--precompute-ref" in r["who"] else r["who"].split()[-1]
            for i, peer in enumerate(PEERS.get(mode, (None, None))):
                p = ok.get(peer)
                if p:
                    vs[i] = f"{r['pairs_s'] / p['pairs_s']:.2f}x, {r['peak_GiB'] / p['peak_GiB']:.2f}x ({peer})"
        extra = f"  (reference pass {r['precompute_s']:.1f} s)" if "precompute_s" in r else ""
        print(f"{r['who']:<44} {r['pairs_s']:>8.2f} {r['peak_GiB']:>9.2f}   {vs[0]:<30} {vs[1]:<30}{extra}")
PY
rm -rf "$work"
