#!/usr/bin/env bash
# `loom doctor --model`'s memory estimate against the measured peak of `loom train` (issue 36), on the
# GPU machine after build-gpu is built: the scoreboard shapes (1b at batch 8, 8b at batch 4, x 2048
# tokens, LoRA r16 on every projection, bf16) in each --checkpointing mode, LoRA and QLoRA. The weights
# are drawn on the device (--random-init: no folder on disk). Prints one table (estimate, measured
# peak of Loom's allocator, ratio) and writes every line to $OUT/memory.jsonl.
#   bench/e2e/memory_check.sh [1b 8b]
# Env: LOOM_MEM_MODES (default "none recompute offload"), LOOM_MEM_BASES (default "lora qlora"),
# LOOM_MEM_STEPS (default 3).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-memory-out}
mkdir -p "$out"
results="$out/memory.jsonl"
: > "$results"
loom=${LOOM_BIN:-build-gpu/tools/loom}
work=$(mktemp -d)
source bench/e2e/model.sh
data="$work/data.jsonl"
python3 bench/e2e/long_document.py "$data" || exit 1
for shape in ${@:-1b 8b}; do
  cfg=$(config_dir "$shape") || exit 1
  batch=$([ "$shape" = 8b ] && echo 4 || echo 8)
  for base in ${LOOM_MEM_BASES:-lora qlora}; do
    q=$([ "$base" = qlora ] && echo --qlora || true)
    "$loom" doctor --model "$cfg" --seq-len 2048 --batch-size "$batch" --device cuda $q > "$work/est.txt" 2>&1
    for mode in ${LOOM_MEM_MODES:-none recompute offload}; do
      run="$work/run-$shape-$base-$mode"
      "$loom" train --random-init --model "$cfg" --data "$data" --out "$run" --device cuda --dtype bf16 --seq-len 2048 \
        --batch-size "$batch" --max-steps "${LOOM_MEM_STEPS:-3}" --lora-r 16 --checkpointing "$mode" $q --quiet \
        > "$run.log" 2>&1
      python3 - "$work/est.txt" "$run/metrics.jsonl" "$shape" "$base" "$mode" "$batch" "$run.log" <<'PY' | tee -a "$results"
import json, re, sys
est_path, metrics, shape, base, mode, batch, log = sys.argv[1:]
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
est = None
for line in open(est_path):
    f = line.split()
    if f and f[0] == mode:
        cells = re.findall(r"([\d.]+) (B|KiB|MiB|GiB|TiB)", line)
        if cells:
            est = float(cells[-1][0]) * units[cells[-1][1]] / 2**30
r = {"shape": shape, "base": base, "mode": mode, "batch": int(batch), "seq": 2048, "estimate_GiB": est}
try:
    rows = [json.loads(l) for l in open(metrics)]
    r["measured_GiB"] = round(max(x["mem_bytes"] for x in rows) / 2**30, 3)
    r["host_GiB"] = round(max(x.get("host_mem_bytes", 0) for x in rows) / 2**30, 3)
    r["tok_s"] = rows[-1].get("tokens_per_s")
    if est:
        r["ratio"] = round(est / r["measured_GiB"], 3)
except (OSError, ValueError):
    r["error"] = (open(log).read().strip().splitlines() or ["no output"])[-1][:300]
print(json.dumps(r))
PY
      rm -rf "$run"
    done
  done
done
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n| shape | base | mode | estimate GiB | measured GiB | estimate / measured |\n|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['shape']} b{r['batch']} | {r['base']} | {r['mode']} | {r.get('estimate_GiB')} | "
          f"{r.get('measured_GiB', r.get('error', ''))} | {r.get('ratio', '')} |")
PY
rm -rf "$work"
