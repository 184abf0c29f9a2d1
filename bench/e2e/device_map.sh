#!/usr/bin/env bash
# --device-map on one GPU (issue 34), on the GPU machine after build-gpu is built: `loom train`
# (LoRA r16 alpha 32 on the seven projections, bf16, random-init weights, one long document) of
#   - the Llama-3-8B shape at batch 4 x 2048 (--checkpointing recompute) whole on the GPU, then with
#     --device-map auto --max-memory cuda:0=$LOOM_DM_CAP_8B (default 12GiB): the layers past the cap are
#     streamed from pinned host memory; the same losses are expected, and the tokens/s ratio is printed;
#   - the Llama-3-70B shape (80 layers) with --qlora --device-map auto --max-memory cuda:0=22GiB at
#     batch $LOOM_DM_BATCH_70B (default 1) x 2048: the plan, tokens/s, peak GPU (Loom's count and
#     nvidia-smi's) and peak host memory (the process's maximum resident set, pinned buffers included).
# Writes each run's metrics.jsonl and log (its plan) under $OUT, and one table.
#   bench/e2e/device_map.sh [8b] [8b-f32] [70b] [70b-<cap GiB>] [1b-f32] [generate] [2gpu]   (default: 8b 70b)
# 8b-f32: the 8B shape at batch 4 x 2048 in f32 with and without streaming (cap 24 GiB), losses bit for bit.
# 1b-f32: the Llama-3.2-1B shape in f32 (whose kernels are deterministic) with and without streaming,
# at batch 2 x 2048: the losses compared bit for bit.
# 2gpu (two GPUs, issue 35): the 8B shape on one GPU and --device-map balanced over two, and the 70B
# shape QLoRA balanced, beside transformers + PEFT with device_map="auto" over the same GPUs
# (bench/e2e/device_map_peer.py, the 8B shape).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-dm-out}
mkdir -p "$out"
loom=${LOOM_BIN:-build-gpu/tools/loom}
work=$(mktemp -d)
source bench/e2e/model.sh
steps=${LOOM_DM_STEPS:-8}
python3 bench/e2e/long_document.py "$work/data.jsonl" || exit 1

smi_peak() {  # command... -> runs it, and writes nvidia-smi's peak MiB to $work/smi.peak
  : > "$work/smi.txt"
  nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$work/smi.txt" 2> /dev/null &
  local pid=$! rc
  "$@"
  rc=$?
  kill $pid 2> /dev/null; wait $pid 2> /dev/null
  sort -n "$work/smi.txt" | tail -1 > "$work/smi.peak"
  return $rc
}

run() {  # name shape batch flags... -> $out/<name>.metrics.jsonl, $out/<name>.log
  local name=$1 shape=$2 batch=$3; shift 3
  local cfg; cfg=$(config_dir "$shape") || return 1
  local rss="$work/$name.rss"
  smi_peak /usr/bin/env python3 - "$rss" "$loom" train --overwrite --random-init --model "$cfg" --data "$work/data.jsonl" \
    --out "$work/run-$name" --device cuda --seq-len 2048 --batch-size "$batch" --max-steps "$steps" --lora-r 16 \
    --lora-alpha 32 --lr 2e-4 --seed 0 --log-every 1 "$@" > "$out/$name.log" 2>&1 <<'PY'
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(rc)
PY
  local rc=$?
  cp "$work/run-$name/metrics.jsonl" "$out/$name.metrics.jsonl" 2> /dev/null
  python3 - "$name" "$rc" "$out/$name.metrics.jsonl" "$(cat "$work/smi.peak" 2> /dev/null)" "$(cat "$rss" 2> /dev/null)" <<'PY' | tee -a "$out/device_map.jsonl"
import json, statistics, sys
name, rc, path, smi, rss = sys.argv[1:]
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
r = {"run": name, "rc": int(rc), "steps": len(rows)}
if rows:
    timed = rows[max(1, len(rows) // 4):] or rows
    r.update(tok_s=round(statistics.median(x["tokens_per_s"] for x in timed)),
             peak_GiB=round(max(x["mem_bytes"] for x in rows) / 2**30, 2),
             **{f"peak_GiB/{k.split('/', 1)[1]}": round(max(x.get(k, 0) for x in rows) / 2**30, 2)
                for k in rows[-1] if k.startswith("mem_bytes/")},  # the other GPUs of a map
             losses=[x["loss"] for x in rows])
if smi: r["smi_GiB"] = round(int(smi) / 1024, 2)
if rss: r["host_rss_GiB"] = round(int(rss) / 2**30, 2)
print(json.dumps(r))
PY
  rm -rf "$work/run-$name"
}

compare() {  # prefix -> one line: <prefix>-streamed against <prefix>-resident (tokens/s, peak, losses bit for bit?)
  python3 - "$out/device_map.jsonl" "$1" <<'PY'
import json, sys
rows = {r["run"]: r for r in map(json.loads, open(sys.argv[1]))}
p = sys.argv[2]
a, b = rows.get(f"{p}-resident", {}), rows.get(f"{p}-streamed", {})
if a.get("losses") and b.get("losses"):
    diff = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    print(f"{p} streamed / resident: {b['tok_s'] / a['tok_s']:.3f}x tokens/s (issue 34 asks >= 0.8x); peak {b['peak_GiB']} "
          f"GiB against {a['peak_GiB']}; losses over {len(a['losses'])} steps "
          f"{'bit for bit equal' if a['losses'] == b['losses'] else f'differ by up to {diff:.3g}'}")
PY
}

shapes=${*:-8b 70b}
for s in $shapes; do
  case $s in
    8b)
      run 8b-resident 8b 4 --checkpointing recompute
      run 8b-streamed 8b 4 --checkpointing recompute --device-map auto --max-memory "cuda:0=${LOOM_DM_CAP_8B:-12GiB}"
      compare 8b
      ;;
    8b-f32)  # the issue's 8B shape at batch 4 x 2048 in f32 (deterministic kernels): streamed vs resident bit for bit
      run 8b-f32-resident 8b 4 --checkpointing recompute --dtype f32
      run 8b-f32-streamed 8b 4 --checkpointing recompute --dtype f32 --device-map auto --max-memory "cuda:0=${LOOM_DM_CAP_8B_F32:-24GiB}"
      compare 8b-f32
      ;;
    1b-f32)  # f32 (deterministic kernels): is the streamed run bit for bit the resident one?
      run 1b-f32-resident 1b 2 --checkpointing recompute --dtype f32
      run 1b-f32-streamed 1b 2 --checkpointing recompute --dtype f32 --device-map auto --max-memory "cuda:0=${LOOM_DM_CAP_1B:-5GiB}"
      compare 1b-f32
      ;;
    8b-resident-only)  # the resident run alone (a repeat: how far two identical runs differ)
      run 8b-resident 8b 4 --checkpointing recompute
      ;;
    70b)
      run 70b-qlora-22g 70b "${LOOM_DM_BATCH_70B:-1}" --qlora --device-map auto --max-memory cuda:0=22GiB
      ;;
    70b-*)  # another cap: 70b-19 runs --max-memory cuda:0=19GiB
      run "70b-qlora-${s#70b-}g" 70b "${LOOM_DM_BATCH_70B:-1}" --qlora --device-map auto --max-memory "cuda:0=${s#70b-}GiB"
      ;;
    generate)  # loom generate on the 8B shape (a `loom init` folder), whole and streamed past a 10 GiB cap
      m=$(model_dir 8b) || exit 1
      for cap in "" "--device-map auto --max-memory cuda:0=10GiB"; do
        "$loom" generate --model "$m" --device cuda --prompt "The weaver said" --max-new-tokens 64 --temperature 0 \
          $cap > "$work/gen.txt" 2> "$work/gen.err"
        echo "{\"run\": \"generate ${cap:-resident}\", \"text_md5\": \"$(md5sum < "$work/gen.txt" | cut -c1-12)\", \"stderr\": \"$(tail -1 "$work/gen.err")\"}" \
          | tee -a "$out/device_map.jsonl"
      done
      ;;
    2gpu)  # issue 35 (nvidia-h200-x2): the 8B shape split over both GPUs against one, and the 70B shape balanced
      run 8b-one-gpu 8b 4 --checkpointing recompute
      run 8b-balanced 8b 4 --checkpointing recompute --device-map balanced
      run 70b-qlora-balanced 70b "${LOOM_DM_BATCH_70B:-1}" --qlora --device-map balanced
      # The tutorial's setup: transformers + PEFT with device_map="auto" over the same two GPUs, same shape
      # and batch (a `loom init` folder of the 8B shape; with and without gradient checkpointing).
      m=$(model_dir 8b) || exit 1
      for gc in "--gc" ""; do
        timeout 600 python3 bench/e2e/device_map_peer.py "$m" --batch-size 4 --seq-len 2048 --steps "$steps" $gc \
          --json-shape 8b 2> "$out/peer.err" | tee -a "$out/device_map.jsonl"
      done
      ;;
  esac
done
rm -rf "$work"
