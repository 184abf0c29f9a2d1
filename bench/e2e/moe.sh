#!/usr/bin/env bash
# The mixture-of-experts training benchmark (issue 33), on the GPU machine after build-gpu is built:
# `loom train` (LoRA r16 alpha 32 on the attention projections and the experts, bf16, and --qlora) in
# each --checkpointing mode against, in the same call, transformers 5.17 + PEFT 0.21 (LoRA on q/k/v/o
# and on the experts through target_parameters, the router frozen, the fastest experts implementation
# transformers offers as a one-block probe finds it; with and without gradient checkpointing), the same
# with bitsandbytes NF4 (QLoRA), and Unsloth 2026.10.9's MoE path (LoRA and QLoRA, its "unsloth"
# checkpointing or none), all at batch x 2048 on random-init weights of one shape (bench/e2e/moe_model.py).
# Prints one table (tokens/s, peak GPU memory by the framework's own count and by nvidia-smi, MFU over the
# active parameters, ratios, the issue's contract) and writes every raw JSON line to $OUT/moe.jsonl.
#   bench/e2e/moe.sh [qwen3moe30b|mixtral8x7b|qwen3moe_smoke ...]   (default: qwen3moe_smoke)
# Shapes: qwen3moe30b = Qwen3-30B-A3B (48 layers, 128 experts, top 8, hidden 2048, expert width 768),
# mixtral8x7b = Mixtral-8x7B (32 layers, 8 experts, top 2, hidden 4096, width 14336), qwen3moe_smoke = 4
# layers of the Qwen3 shape; qwen3moe_tiny / mixtral_tiny = toy widths for a CPU check of the scripts.
# Env:
#   LOOM_MOE_LAYERS   decoder layers to build and run: "24" for every shape of the call, or per shape
#                     ("qwen3moe30b=24 mixtral8x7b=12"); default the shape's own depth. The folder Loom reads
#                     is bf16 on disk: 61 GB for the 48-layer Qwen3 shape, 93 GB for Mixtral's 32 layers,
#                     against the GPU machine's 64 GiB disk; moe_model.py refuses what does not fit (after the
#                     cache's other random-init folders, MoE and dense, are removed to make room, then /dev/shm is
#                     tried when it has room: untried on the GPU machine so far). Tokens/s and memory then stand for
#                     that many layers; the table says how many of the shape's ran.
#   LOOM_MOE_MODES    Loom's bf16 LoRA --checkpointing modes (default "none recompute offload")
#   LOOM_MOE_QLORA_MODES  the same with --qlora (default "none offload")
#   LOOM_MOE_PEERS    moe_peer.py modes (default "probe peft peft-gc bnb bnb-gc unsloth unsloth-nogc
#                     unsloth-qlora"; "probe" picks the experts implementation the peft/bnb modes use;
#                     unsloth* need .peers carried, bnb needs bitsandbytes: .peers or installed; peft and
#                     bnb draw their base in memory, unsloth reads the bf16 folder, written first)
#   MOE_PEER_SOURCE   folder: peft and bnb read that folder too (from_pretrained), as sessions before 43 ran bnb
#   LOOM_MOE_EXPERTS  transformers' experts implementation, skipping the probe (grouped_mm, batched_mm, eager)
#   LOOM_MOE_BATCH    rows a step (default: 4 for the 30B/8x7B shapes), LOOM_MOE_SEQ (default 2048)
#   LOOM_MOE_STEPS    Loom's steps (default 12, the first quarter warm-up); the peers run 3 warm-up steps and
#                     LOOM_MOE_STEPS - 3 timed ones
#   LOOM_MOE_FLAGS    more `loom train` flags
#   LOOM_MOE_TARGETS  Loom's --lora-targets (default q_proj,k_proj,v_proj,o_proj,experts: the peers' set)
#   LOOM_MOE_LOOM_SOURCE  random (default: `loom train --random-init` on config.json alone, any depth fits the
#                     disk) or folder (the bf16 folder the bnb and Unsloth peers read)
#   LOOM_MOE_INIT     torch (default: moe_model.py draws the folder on the GPU) or loom (`loom init --from`
#                     the config: needs the families registered, and host memory for the model in f32)
#   LOOM_BIN / LOOM_MOE_PEER_WRAP  the loom binary, and a command put before the peers' `python3` (both for
#                     profiling: a script that runs tools/gpu/kernel_profile.sh on its arguments)
#   LOOM_MOE_RUN_TIMEOUT (Loom, default 420 s), LOOM_MOE_PEER_TIMEOUT (a peer mode, default 420 s)
#   LOOM_MOE_PREVIOUS a moe.jsonl of an earlier call: its lines open this call's results (a shape whose rows
#                     take more than one device call: LOOM_MOE_PEERS=" " first, then LOOM_MOE_MODES=" "
#                     LOOM_MOE_QLORA_MODES=" " with the peers)
#   LOOM_MOE_DEVICE / LOOM_MOE_DTYPE  cuda / bf16 (cpu / f32: the peers' check on a machine without a GPU)
#   LOOM_E2E_CACHE    where the folders are kept across calls on a warm machine (default /tmp/loom-e2e)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-moe-out}
mkdir -p "$out"
results="$out/moe.jsonl"
if [ -n "${LOOM_MOE_PREVIOUS:-}" ]; then  # (this call's own file: its lines stay, the new ones follow)
  [ "$LOOM_MOE_PREVIOUS" -ef "$results" ] || cp "$LOOM_MOE_PREVIOUS" "$results" || exit 1
else
  : > "$results"
fi
loom=${LOOM_BIN:-build-gpu/tools/loom}
steps=${LOOM_MOE_STEPS:-12}
seq=${LOOM_MOE_SEQ:-2048}
device=${LOOM_MOE_DEVICE:-cuda}
dtype=${LOOM_MOE_DTYPE:-bf16}
cache=${LOOM_E2E_CACHE:-/tmp/loom-e2e}
work=$(mktemp -d)
last=$SECONDS
emit() {  # one result line; $out/walls.txt gets the seconds since the previous line (the run's wall, for planning calls)
  echo "$1" | tee -a "$results"
  echo "$((SECONDS - last)) s  ${1:0:160}" >> "$out/walls.txt"; last=$SECONDS
}
fail_line() {  # shape layers who error -> a JSON line
  python3 -c 'import json, sys; s, l, w, e = sys.argv[1:]; print(json.dumps({"shape": s, "layers": int(l), "who": w, "ok": False, "error": e[:300]}))' "$@"
}

if [ -d .peers ] && [ ! -f /tmp/site/.unsloth_installed ]; then  # as .peers/run_unsloth.sh installs them
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .peers/*.whl \
    > "$work/pip.log" 2>&1 && touch /tmp/site/.unsloth_installed
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}

layers_of() {  # shape -> the layers to run (LOOM_MOE_LAYERS), or the shape's own depth
  local tok n=""
  for tok in ${LOOM_MOE_LAYERS:-}; do
    case $tok in "$1"=*) n=${tok#*=} ;; *=*) ;; *) [ -z "$n" ] && n=$tok ;; esac
  done
  [ -n "$n" ] || n=$(python3 bench/e2e/moe_model.py "$1" --info | python3 -c 'import json, sys; print(json.load(sys.stdin)["layers"])')
  echo "$n"
}

moe_dir() {  # shape layers -> a random-init bf16 Hugging Face folder (kept in $cache across calls)
  local shape=$1 layers=$2 d="$cache/model-moe-$1-L$2" rc
  [ -f "$d/config.json" ] && [ -n "$(ls "$d"/*.safetensors 2>/dev/null)" ] && { echo "$d"; return; }
  mkdir -p "$cache"
  if [ "${LOOM_MOE_INIT:-torch}" = loom ]; then
    python3 bench/e2e/moe_model.py "$shape" --config-only "$work/cfg-$shape" --layers "$layers" || return 1
    "$loom" init --from "$work/cfg-$shape" --out "$d.tmp$$" --seed 0 > "$work/init.log" 2>&1 && mv "$d.tmp$$" "$d" \
      || { tail -1 "$work/init.log" >&2; return 1; }
  else
    python3 bench/e2e/moe_model.py "$shape" "$d" --layers "$layers" --device "$device" > /dev/null 2> "$work/init.log"
    rc=$?
    if [ $rc = 3 ]; then  # no room: the cache's other random-init folders go (remade when asked for), then once more
      find "$cache" -maxdepth 1 -name 'model-*' ! -name "model-moe-$shape-L$layers" -exec rm -rf {} +
      python3 bench/e2e/moe_model.py "$shape" "$d" --layers "$layers" --device "$device" > /dev/null 2> "$work/init.log"
      rc=$?
    fi
    local shm=/dev/shm/loom-e2e
    if [ $rc = 3 ] && [ -d /dev/shm ] && [ "$cache" != "$shm" ]; then
      # Still no room (the 48-layer Qwen3 folder is 61 GB, the GPU machine's disk 64 GiB): a RAM disk with
      # room for it, if the machine has one (moe_model.py checks its free space as it does the disk's).
      mkdir -p "$shm" && d="$shm/model-moe-$1-L$2"
      [ -f "$d/config.json" ] && [ -n "$(ls "$d"/*.safetensors 2>/dev/null)" ] && { echo "$d"; return; }
      python3 bench/e2e/moe_model.py "$shape" "$d" --layers "$layers" --device "$device" > /dev/null 2> "$work/init.log"
      rc=$?
    fi
    [ $rc = 0 ] || { tail -1 "$work/init.log" >&2; return 1; }
  fi
  echo "$d"
}

data_file() {  # one document of ~1.8M tokens: every row is a plain causal piece of it (long_document.py)
  local f="$work/data.jsonl"
  [ -f "$f" ] || python3 bench/e2e/long_document.py "$f" || return 1
  echo "$f"
}

# nvidia-smi's peak of used GPU memory while a command runs (the same measure for every framework: it counts
# the CUDA context and whatever the allocator holds, which the frameworks' own peaks leave out).
smi_start() {
  smi_pid=""
  : > "$work/smi.txt"
  if command -v nvidia-smi > /dev/null 2>&1 && [ "$device" = cuda ]; then
    nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$work/smi.txt" 2> /dev/null &
    smi_pid=$!
  fi
}
smi_stop() {  # -> the peak in MiB, or nothing
  if [ -n "$smi_pid" ]; then kill "$smi_pid" 2> /dev/null; wait "$smi_pid" 2> /dev/null; fi
  sort -n "$work/smi.txt" 2> /dev/null | tail -1 | tr -dc '0-9'
}
with_smi() {  # JSON line, MiB -> the line with smi_GiB
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
if sys.argv[2]:
    r["smi_GiB"] = round(int(sys.argv[2]) / 1024, 2)
print(json.dumps(r))' "$1" "$2"
}

loom_run() {  # shape layers batch mode [extra flags, e.g. --qlora] -> one JSON line
  local shape=$1 layers=$2 batch=$3 mode=$4 extra=${5:-} m d run rc mib line init=""
  if [ "${LOOM_MOE_LOOM_SOURCE:-random}" = random ]; then  # config.json alone, weights drawn on the GPU (--random-init)
    m="$work/cfg-$shape-L$layers"
    [ -f "$m/config.json" ] || python3 bench/e2e/moe_model.py "$shape" "$m" --config-only --layers "$layers" > /dev/null
    init=--random-init
  elif ! m=$(moe_dir "$shape" "$layers" 2> "$work/dir.err"); then
    fail_line "$shape" "$layers" "loom ${extra:+$extra }--checkpointing $mode" "model folder: $(tail -1 "$work/dir.err")"; return
  fi
  d=$(data_file) || return 1
  run="$work/run-$shape-$mode${extra// /}"
  smi_start
  timeout "${LOOM_MOE_RUN_TIMEOUT:-420}" "$loom" train --overwrite --model "$m" --data "$d" --out "$run" --device "$device" \
    --dtype "$dtype" --seq-len "$seq" --batch-size "$batch" --max-steps "$steps" --lora-r 16 --lora-alpha 32 --lr 2e-4 \
    --checkpointing "$mode" --lora-targets "${LOOM_MOE_TARGETS:-q_proj,k_proj,v_proj,o_proj,experts}" $init $extra \
    ${LOOM_MOE_FLAGS:-} --quiet > "$run.log" 2>&1
  rc=$?
  mib=$(smi_stop)
  line=$(python3 - "$run/metrics.jsonl" "$shape" "$layers" "$mode" "$batch" "$seq" "$rc" "$run.log" "$extra" "$steps" <<'PY'
import json, statistics, sys
path, shape, layers, mode, batch, seq, rc, log, extra, steps = sys.argv[1:]
r = {"shape": shape, "layers": int(layers), "who": f"loom {extra + ' ' if extra else ''}--checkpointing {mode}",
     "peer": "loom", "mode": mode, "gc": mode != "none", "base": "nf4" if "--qlora" in extra else "bf16",
     "batch": int(batch), "seq": int(seq)}
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
if rc != "0" or len(rows) < min(3, int(steps)):
    try:
        tail = open(log).read().strip().splitlines()[-1:]
    except OSError:
        tail = []
    print(json.dumps(dict(r, ok=False, error=(tail[0] if tail else f"exit {rc}")[:300])))
else:
    rows = rows[max(1, len(rows) // 4):] or rows  # past warm-up (allocator, cuBLASLt heuristics)
    print(json.dumps(dict(r, ok=True, tok_s=round(statistics.median(x["tokens_per_s"] for x in rows)),
                          peak_GiB=round(max(x["mem_bytes"] for x in rows) / 2**30, 2),
                          host_GiB=round(max(x.get("host_mem_bytes", 0) for x in rows) / 2**30, 2),
                          reserved_GiB=round(max(x.get("mem_reserved_bytes", 0) for x in rows) / 2**30, 2),
                          loss=rows[-1]["loss"])))
PY
)
  rm -rf "$run"  # the adapter and state it saved (GBs with LoRA on 128 experts a layer): the disk is small
  with_smi "$line" "$mib"
}

peer_run() {  # shape layers batch mode [--model-dir DIR] -> one JSON line (moe_peer.py's, with smi_GiB)
  local shape=$1 layers=$2 batch=$3 mode=$4 line mib; shift 4
  smi_start
  line=$(BENCH_MODE_TIMEOUT_S=${LOOM_MOE_PEER_TIMEOUT:-420} ${LOOM_MOE_PEER_WRAP:-} python3 bench/e2e/moe_peer.py "$shape" "$mode" --layers "$layers" \
    --batch "$batch" --seq "$seq" --steps $((steps > 5 ? steps - 3 : 2)) --warmup 3 --device "$device" --dtype "$dtype" \
    --experts "$experts" "$@" 2>> "$out/peer.err" | tail -1)
  mib=$(smi_stop)
  [[ $line == "{"* ]] || line=$(fail_line "$shape" "$layers" "$mode" "moe_peer.py printed nothing (see peer.err)")
  with_smi "$line" "$mib"
}

for shape in ${@:-qwen3moe_smoke}; do
  python3 bench/e2e/moe_model.py "$shape" --info > /dev/null || continue  # an unknown shape: argparse lists them
  layers=$(layers_of "$shape") || exit 1
  batch=${LOOM_MOE_BATCH:-$(python3 -c "import sys; sys.path.insert(0, 'bench/e2e'); import moe_model; print(moe_model.SHAPES['$shape']['batch'])")}
  df -h "$cache" 2> /dev/null | tail -1 > "$out/disk-$shape.txt"
  for mode in ${LOOM_MOE_MODES-none recompute offload}; do emit "$(loom_run "$shape" "$layers" "$batch" "$mode")"; done
  for mode in ${LOOM_MOE_QLORA_MODES-none offload}; do emit "$(loom_run "$shape" "$layers" "$batch" "$mode" --qlora)"; done
  experts=${LOOM_MOE_EXPERTS:-grouped_mm}
  for p in ${LOOM_MOE_PEERS-probe peft peft-gc bnb bnb-gc unsloth unsloth-nogc unsloth-qlora}; do
    case $p in
      probe)
        [ -n "${LOOM_MOE_EXPERTS:-}" ] && continue
        line=$(peer_run "$shape" "$layers" "$batch" probe)
        emit "$line"
        best=$(echo "$line" | python3 -c 'import json, sys; r = json.load(sys.stdin); print(r.get("best", "") if r.get("ok") else "")')
        experts=${best:-grouped_mm} ;;
      peft|peft-gc)
        emit "$(peer_run "$shape" "$layers" "$batch" "$p")" ;;
      bnb*|unsloth*)
        if [[ $p == bnb* ]] && [ "${MOE_PEER_SOURCE:-init}" != folder ]; then  # drawn in memory, quantised there
          emit "$(peer_run "$shape" "$layers" "$batch" "$p")"; continue
        fi
        if [[ $p == unsloth* ]] && [ ! -d /tmp/site/unsloth ]; then
          emit "$(fail_line "$shape" "$layers" "$p" "no .peers folder carried (Unsloth's wheels)")"; continue
        fi
        if ! m=$(moe_dir "$shape" "$layers" 2> "$work/dir.err"); then
          emit "$(fail_line "$shape" "$layers" "$p" "model folder: $(tail -1 "$work/dir.err")")"; continue
        fi
        emit "$(peer_run "$shape" "$layers" "$batch" "$p" --model-dir "$m")" ;;
      *) emit "$(fail_line "$shape" "$layers" "$p" "unknown peer mode")" ;;
    esac
  done
done
python3 bench/e2e/moe_table.py "$results" | tee "$out/moe_table.md"
rm -rf "$work"
