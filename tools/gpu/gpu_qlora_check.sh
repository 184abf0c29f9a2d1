#!/usr/bin/env bash
# On the GPU machine after build-gpu is built: the QLoRA checks that need CUDA and bitsandbytes.
#  1. `loom quantize` of each tiny family fixture, loaded by transformers + bitsandbytes
#     (tools/check/check_bnb_load.py: the codes, block scales and logits of bitsandbytes' own checkpoint);
#  2. `loom quantize --device cuda` of the Llama-3-8B shape (random bf16 weights, bench/e2e's model
#     cache, so a later bench/e2e/run.sh 8b on the same machine reuses it): time, sizes, host RSS.
# The quantised 8B folder is deleted afterwards (the machine's disk is 64 GiB; the e2e peers need
# the room). Needs .peers (the bitsandbytes wheel). Prints one line per check; a failed step's log
# tail follows its line.
#   tools/gpu/gpu_qlora_check.sh [families...]   (default: the six; "none" skips step 1)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
loom=${LOOM_BIN:-build-gpu/tools/loom}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0

python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/bitsandbytes-*.whl > /dev/null 2>&1 ||
  { echo "bitsandbytes: no wheel under .peers (copy ../shared/peers there)"; exit 1; }
families=${*:-llama mistral qwen2 qwen3 gemma gemma2}
[ "$families" = none ] && families=
for v in $families; do
  if ! "$loom" quantize --model "tests/fixtures/models/$v" --out "$work/q_$v" > "$work/quantize_$v.log" 2>&1; then
    echo "$v: loom quantize FAILED"; tail -3 "$work/quantize_$v.log"; status=1; continue
  fi
  PYTHONPATH=/tmp/site python3 tools/check/check_bnb_load.py "$work/q_$v" "$v" 2>&1 | tail -1
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done

source bench/e2e/model.sh
start=$(date +%s)
m8=$(model_dir 8b) || { echo "8b: loom init FAILED"; exit 1; }
echo "8b: random bf16 model ready in $(( $(date +%s) - start )) s ($(du -sm "$m8" | cut -f1) MB)"
timer=(); [ -x /usr/bin/time ] && timer=(/usr/bin/time -v)
"${timer[@]}" "$loom" quantize --model "$m8" --out "$work/q8" --device cuda > "$work/quantize_8b.log" 2>&1 ||
  { echo "8b: loom quantize FAILED"; tail -5 "$work/quantize_8b.log"; status=1; }
grep -vE "^\s+(Average|Exit|Socket|Signals|Swaps|Page size|File system|Major|Minor|Voluntary|Involuntary|Percent|System time|User time)" \
  "$work/quantize_8b.log" | tail -8
echo "8b: quantised folder $(du -sm "$work/q8" 2>/dev/null | cut -f1) MB"
exit $status
