#!/usr/bin/env bash
# The end-to-end training scoreboard, on the GPU machine after build-gpu is built: `loom train` in
# each --checkpointing mode against transformers + PEFT (sdpa, fused AdamW; with and without
# gradient checkpointing), and, when ../shared/peers was copied to .peers and carried, PEFT +
# bitsandbytes QLoRA and Unsloth 2026.10.9 — same random Llama-shaped weights, same batch, same
# sequence, LoRA r16 on all seven projections, bf16. Prints one table (tokens/s, peak GPU memory,
# MFU, ratios) and writes every raw JSON line to $OUT/e2e.jsonl.
#   bench/e2e/run.sh [1b|8b|phi35|gemma3_4b ...]   (default: 1b; phi35 and gemma3_4b: Phi-3.5-mini and
#   Gemma-3-4B shapes, whose Unsloth peer is bench/e2e/unsloth_family.py)
# Env: LOOM_E2E_MODES (default "none recompute offload"), LOOM_E2E_QLORA_MODES (the same with
# --qlora, default none), LOOM_E2E_PEERS (default "peft peft-gc";
# add "bnb unsloth" to run those too; Unsloth runs LOOM_E2E_UNSLOTH, modes of .peers/unsloth_bench.py
# without the shape ("lora lora-nogc", plus "qlora" when LOOM_E2E_QLORA_MODES is set) or with one
# ("8b-qlora": that shape only); bitsandbytes' script measures both shapes at once, and both are
# recorded whichever shape asked), LOOM_E2E_STEPS (default 12), LOOM_E2E_CTX ("1" adds the
# longest-sequence search at batch 1 on the 8B shape: LOOM_E2E_CTX_LIST, LOOM_E2E_CTX_MODES,
# LOOM_E2E_CTX_STEPS (default 2), LOOM_E2E_CTX_EXTRA (e.g. --qlora), LOOM_E2E_CTX_TIMEOUT per run,
# LOOM_E2E_CTX_PEERS: "peft peft-gc unsloth" search the same list; LOOM_E2E_CTX_UNSLOTH=qlora for
# Unsloth's QLoRA; LOOM_E2E_CTX_PEER_TOTAL (default 560 s) bounds Unsloth's whole search),
# LOOM_E2E_PROFILE (checkpointing modes to run once more, 3 steps under Nsight Compute, the first left
# out (load, and each GEMM shape's algorithm trials), for the kernel-by-kernel time of a step:
# $OUT/profile-<shape>-<mode>.txt, the raw launches in .csv.gz, see tools/gpu/kernel_profile.sh),
# LOOM_E2E_TRACE (checkpointing modes to run once more, 6 steps, under the CUPTI tracer
# tools/gpu/trace: $OUT/trace-<shape>-<mode>.txt says where the last 3 steps' wall time went on the
# device, gaps the host caused included; the timeline itself in .csv.gz),
# LOOM_E2E_AUTOTUNE_MODES (checkpointing modes to run again with --gemm-autotune, named so in the rows),
# LOOM_STEP_TIMING=1 (each Loom run's per-step timing lines, see train/trainer.cpp, go to
# $OUT/timing-<shape>-<mode>-<seq>.txt), LOOM_E2E_PREVIOUS (an e2e.jsonl from an earlier call, same machine kind: its lines open this
# call's results, so that a table too long for one device call, e.g. the 8B shape with every peer,
# is printed whole by the second: LOOM_E2E_PEERS=" " first, then LOOM_E2E_MODES=" " with the peers).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-e2e-out}
mkdir -p "$out"
results="$out/e2e.jsonl"
if [ -n "${LOOM_E2E_PREVIOUS:-}" ]; then cp "$LOOM_E2E_PREVIOUS" "$results" || exit 1; fi
loom=${LOOM_BIN:-build-gpu/tools/loom}
steps=${LOOM_E2E_STEPS:-12}
modes=${LOOM_E2E_MODES:-none recompute offload}
peers=${LOOM_E2E_PEERS:-peft peft-gc}
work=$(mktemp -d)
last=$SECONDS
emit() {  # one result line; $out/walls.txt gets the seconds since the previous line (the run's wall, for planning calls)
  echo "$1" | tee -a "$results"
  echo "$((SECONDS - last)) s  ${1:0:160}" >> "$out/walls.txt"; last=$SECONDS
}

source bench/e2e/model.sh  # model_dir 1b|8b

data_file() {  # one document of ~1.8M tokens: every row is a plain causal piece of it (long_document.py)
  local f="$work/data.jsonl"
  [ -f "$f" ] || python3 bench/e2e/long_document.py "$f" || return 1
  echo "$f"
}

loom_run() {  # shape mode batch seq [extra flags, e.g. --qlora] -> one JSON line
  local shape=$1 mode=$2 batch=$3 seq=$4 extra=${5:-} m d run
  m=$(model_dir "$shape") && d=$(data_file) || return 1
  run="$work/run-$shape-$mode-$seq${extra// /}"
  timeout "${LOOM_E2E_RUN_TIMEOUT:-300}" "$loom" train --overwrite --model "$m" --data "$d" --out "$run" --device cuda --dtype bf16 \
    --seq-len "$seq" --batch-size "$batch" --max-steps "$steps" --lora-r 16 --lora-alpha 16 --lr 2e-4 \
    --checkpointing "$mode" $extra --quiet > "$run.log" 2>&1
  local rc=$?
  if [ -n "${LOOM_STEP_TIMING:-}" ]; then grep -h "timing (ms)" "$run.log" > "$out/timing-$shape-$mode-$seq${extra// /}.txt"; fi
  python3 - "$run/metrics.jsonl" "$shape" "$mode" "$batch" "$seq" "$rc" "$run.log" "$extra" "$steps" <<'PY'
import json, statistics, sys
path, shape, mode, batch, seq, rc, log, extra, steps = sys.argv[1:]
who = f"loom {extra + ' ' if extra else ''}--checkpointing {mode}"
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
if rc != "0" or len(rows) < min(3, int(steps)):
    tail = open(log).read().strip().splitlines()[-1:] if log else []
    print(json.dumps({"shape": shape, "who": who, "batch": int(batch), "seq": int(seq), "ok": False,
                      "error": (tail[0] if tail else f"exit {rc}")[:300]}))
else:
    rows = rows[max(1, len(rows) // 4):] or rows  # past warm-up (allocator, cuBLASLt heuristics)
    print(json.dumps({"shape": shape, "who": who, "batch": int(batch), "seq": int(seq), "ok": True,
                      "tok_s": round(statistics.median(r["tokens_per_s"] for r in rows)),
                      "peak_GiB": round(max(r["mem_bytes"] for r in rows) / 2**30, 2),
                      "host_GiB": round(max(r.get("host_mem_bytes", 0) for r in rows) / 2**30, 2),
                      "reserved_GiB": round(max(r.get("mem_reserved_bytes", 0) for r in rows) / 2**30, 2),
                      "loss": rows[-1]["loss"]}))
PY
}

peft_run() {  # shape gc batch seq [warm-up steps] -> one JSON line (ok false with the error's last line)
  local m line; m=$(model_dir "$1") || return 1
  line=$(timeout "${LOOM_E2E_PEER_TIMEOUT:-600}" python3 bench/train_peer.py "$m" --seq-len "$4" --batch-size "$3" --steps "$steps" --warmup "${5:-5}" \
    $([ "$2" = 1 ] && echo --gc) --json-shape "$1" 2>"$work/peft.err" | tail -1)
  if [[ $line == "{"* ]]; then echo "$line"; return; fi
  python3 - "$1" "$2" "$3" "$4" "$work/peft.err" <<'PY'
import json, sys
shape, gc, batch, seq, err = sys.argv[1:]
tail = [l for l in open(err).read().splitlines() if l.strip()][-1:]
print(json.dumps({"shape": shape, "who": "transformers+peft (sdpa)" + (" + gradient checkpointing" if gc == "1" else ""),
                  "batch": int(batch), "seq": int(seq), "ok": False,
                  "error": (tail[0] if tail else "no output (timed out?)")[:300]}))
PY
}

for shape in ${@:-1b}; do
  if [ "$shape" = 1b ]; then batch=8; else batch=4; fi  # 8b and the 4B-class family shapes: 4 rows
  for mode in $modes; do emit "$(loom_run "$shape" "$mode" "$batch" 2048)"; done
  for mode in ${LOOM_E2E_QLORA_MODES:-}; do emit "$(loom_run "$shape" "$mode" "$batch" 2048 --qlora)"; done
  for mode in ${LOOM_E2E_AUTOTUNE_MODES:-}; do emit "$(loom_run "$shape" "$mode" "$batch" 2048 --gemm-autotune)"; done
  for mode in ${LOOM_E2E_PROFILE:-}; do
    STEPS=2 SKIP=1 TOP=45 timeout 400 tools/gpu/kernel_profile.sh "$work/profile.csv" "$loom" train --overwrite --model "$(model_dir "$shape")" \
      --data "$(data_file)" --out "$work/profile-run" --device cuda --dtype bf16 --seq-len 2048 --batch-size "$batch" \
      --max-steps 3 --lora-r 16 --lora-alpha 16 --lr 2e-4 --checkpointing "$mode" --quiet > "$out/profile-$shape-$mode.txt" 2>&1
    gzip -c "$work/profile.csv" > "$out/profile-$shape-$mode.csv.gz"  # every launch with its grid, for the shapes
    rm -rf "$work/profile-run"
  done
  for mode in ${LOOM_E2E_TRACE:-}; do  # the run as it ran: kernels, copies and API calls on one clock
    if [ -z "${LOOM_TRACE_ENV:-}" ]; then eval "$(tools/gpu/trace/build.sh)"; fi
    [ -n "${LOOM_TRACE_ENV:-}" ] || { echo "no trace: tools/gpu/trace/build.sh failed" > "$out/trace-$shape-$mode.txt"; continue; }
    env $LOOM_TRACE_ENV LOOM_TRACE_OUT="$work/trace.csv" timeout 300 "$loom" train --overwrite --model "$(model_dir "$shape")" \
      --data "$(data_file)" --out "$work/trace-run" --device cuda --dtype bf16 --seq-len 2048 --batch-size "$batch" \
      --max-steps 6 --lora-r 16 --lora-alpha 16 --lr 2e-4 --checkpointing "$mode" --quiet > "$work/trace-run.log" 2>&1
    { tail -3 "$work/trace-run.log"; python3 tools/gpu/trace/timeline.py "$work/trace.csv" --last 3 --top 30; } \
      > "$out/trace-$shape-$mode.txt" 2>&1
    gzip -c "$work/trace.csv" > "$out/trace-$shape-$mode.csv.gz"
    rm -rf "$work/trace-run" "$work/trace.csv"
  done
  for p in $peers; do
    case $p in
      peft) emit "$(peft_run "$shape" 0 "$batch" 2048)" ;;
      peft-gc) emit "$(peft_run "$shape" 1 "$batch" 2048)" ;;
      bnb|unsloth)
        [ -d .peers ] || { echo "{\"who\": \"$p\", \"ok\": false, \"error\": \"no .peers folder carried\"}"; continue; }
        if [ "$p" = unsloth ]; then
          umodes=()  # LOOM_E2E_UNSLOTH: modes without a shape run for every shape, "8b-qlora" for its own
          for m in ${LOOM_E2E_UNSLOTH:-lora lora-nogc${LOOM_E2E_QLORA_MODES:+ qlora}}; do
            case $m in 1b-*|8b-*) [[ $m == "$shape"-* ]] && umodes+=("$m") ;; *) umodes+=("$shape-$m") ;; esac
          done
          [ ${#umodes[@]} -gt 0 ] || continue
          if [ "$shape" = 1b ] || [ "$shape" = 8b ]; then
            OUT="$work/unsloth-$shape" bash .peers/run_unsloth.sh "${umodes[@]}" > "$work/unsloth-$shape.log" 2>&1
          else  # the family shapes: bench/e2e/unsloth_family.py on the same folder (wheels installed as run_unsloth.sh does)
            mkdir -p "$work/unsloth-$shape/r"
            [ -f /tmp/site/.unsloth_installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile \
              --no-cache-dir --upgrade --target /tmp/site .peers/*.whl && touch /tmp/site/.unsloth_installed; }
            PYTHONPATH=/tmp/site timeout 700 python3 bench/e2e/unsloth_family.py "$(model_dir "$shape")" "$shape" "$batch" 2048 \
              "${umodes[@]#"$shape"-}" > "$work/unsloth-$shape/r/results.jsonl" 2> "$work/unsloth-$shape.log"
          fi
          grep -h '"mode"' "$work/unsloth-$shape"/r/results.jsonl 2>/dev/null | while read -r l; do emit "{\"shape\": \"$shape\", \"who\": \"unsloth\", \"raw\": $l}"; done
          last=$SECONDS  # the lines were emitted in a subshell
        else
          if [ ! -f "$work/bnb.out" ]; then  # one run measures both shapes: both go to the results
            # (a later call's table for the other shape reads them through LOOM_E2E_PREVIOUS)
            python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/bitsandbytes-*.whl > /dev/null 2>&1
            PYTHONPATH=/tmp/site timeout 400 python3 .peers/peft_bnb_qlora.py > "$work/bnb.out" 2>/dev/null
            for s in 1b 8b; do
              grep -i "$s" "$work/bnb.out" | while read -r l; do emit "{\"shape\": \"$s\", \"who\": \"peft+bnb\", \"raw\": $l}"; done
            done
          last=$SECONDS
          fi
        fi ;;
    esac
  done
done
if [ "${LOOM_E2E_CTX:-0}" = 1 ]; then  # the longest sequence that trains at batch 1 on the 8B shape
  list=${LOOM_E2E_CTX_LIST:-16384 32768 65536 131072 262144 393216 524288}
  for mode in ${LOOM_E2E_CTX_MODES:-offload}; do
    for seq in $list; do
      steps=${LOOM_E2E_CTX_STEPS:-2}
      LOOM_E2E_RUN_TIMEOUT=${LOOM_E2E_CTX_TIMEOUT:-400}
      line=$(loom_run 8b "$mode" 1 "$seq" "${LOOM_E2E_CTX_EXTRA:-}")
      emit "$line"
      echo "$line" | grep -q '"ok": true' || break
    done
  done
  for p in ${LOOM_E2E_CTX_PEERS:-}; do  # the same search for the peers: peft, peft-gc, unsloth
    case $p in
      peft|peft-gc)
        steps=$(( ${LOOM_E2E_CTX_STEPS:-2} + 1 ))  # one warm-up step, then the timed ones
        for seq in $list; do
          line=$(LOOM_E2E_PEER_TIMEOUT=${LOOM_E2E_CTX_TIMEOUT:-400} peft_run 8b "$([ "$p" = peft-gc ] && echo 1 || echo 0)" 1 "$seq" 1)
          emit "$line"
          echo "$line" | grep -q '"ok": true' || break
        done ;;
      unsloth)
        [ -d .peers ] || { echo "{\"who\": \"unsloth\", \"ok\": false, \"error\": \"no .peers folder carried\"}"; continue; }
        # The whole search is one Unsloth mode: its time limits are the search's (one step of 262k
        # takes Unsloth ~200 s, after a warm-up step).
        BENCH_CTX_LIST=${list// /,} BENCH_MODE_TIMEOUT_S=${LOOM_E2E_CTX_PEER_TOTAL:-560} BENCH_TOTAL_S=${LOOM_E2E_CTX_PEER_TOTAL:-560} \
          OUT="$work/unsloth-ctx" bash .peers/run_unsloth.sh "8b-${LOOM_E2E_CTX_UNSLOTH:-lora}-ctx" > "$work/unsloth-ctx.log" 2>&1
        grep -h '"S"' "$work"/unsloth-ctx/r/results.jsonl 2>/dev/null | grep -v ctx_summary | while read -r l; do
          emit "{\"shape\": \"8b\", \"who\": \"unsloth\", \"batch\": 1, \"raw\": $l}"; done
        last=$SECONDS ;;
    esac
  done
fi
python3 bench/e2e/table.py "$results" | tee "$out/e2e_table.md"
rm -rf "$work"
