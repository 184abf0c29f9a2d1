#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/gpu_check.sh built build-gpu: checks Loom's files in the Hugging
# Face ecosystem for every fixture variant — a Loom-saved adapter loads in PEFT with the reference
# logits, `loom merge` output loads in transformers with the merged reference logits, and `loom
# quantize` output loads in transformers + bitsandbytes (tools/check/check_bnb_load.py) — then
# times checkpoint loading of a Llama-3-8B-shaped bf16 checkpoint against raw reads.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
loom=build-gpu/tools/loom
{
  for v in llama llama_tied_bf16 mistral qwen2 qwen3 gemma gemma2; do
    f=tests/fixtures/models/$v
    $loom forward --model $f --adapter $f/adapter --input $f/inputs.safetensors --output /tmp/fw_$v.safetensors --overwrite \
      --save-adapter /tmp/adapter_$v > /dev/null && python3 tools/check/check_peft_adapter.py /tmp/adapter_$v $f 2>&1 | tail -1
    $loom merge --model $f --adapter $f/adapter --out /tmp/merged_$v --device cuda --overwrite > /dev/null &&
      python3 tools/check/check_merged.py /tmp/merged_$v $f 2>&1 | tail -2
  done
  # `loom quantize` output as transformers + bitsandbytes load it (needs the wheel: carry .peers).
  if ls .peers/bitsandbytes-*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/bitsandbytes-*.whl > /dev/null 2>&1
    for v in llama mistral qwen2 qwen3 gemma gemma2; do
      rm -rf /tmp/q_$v && $loom quantize --model tests/fixtures/models/$v --out /tmp/q_$v > /dev/null &&
        PYTHONPATH=/tmp/site python3 tools/check/check_bnb_load.py /tmp/q_$v $v 2>&1 | tail -1
    done
  else
    echo "loom quantize vs transformers + bitsandbytes: skipped (no .peers/bitsandbytes-*.whl carried)"
  fi
} 2>&1 | tee "$out/interop.log"
if [[ "${LOOM_SKIP_LOAD_BENCH:-0}" != 1 ]]; then
  python3 tools/gpu/make_big_checkpoint.py /tmp/llama8b > /dev/null && build-gpu/bench/loom_load_bench /tmp/llama8b 2>&1 | tee "$out/load_bench.log"
  rm -rf /tmp/llama8b
fi
