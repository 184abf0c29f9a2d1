#!/usr/bin/env bash
# On the GPU machine, after tools/gpu_check.sh built build-gpu: checks Loom's files in the Hugging
# Face ecosystem for every fixture variant — a Loom-saved adapter loads in PEFT with the reference
# logits, and `loom merge` output loads in transformers with the merged reference logits — then
# times checkpoint loading of a Llama-3-8B-shaped bf16 checkpoint against raw reads.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
loom=build-gpu/tools/loom
{
  for v in llama llama_tied_bf16 mistral qwen2 qwen3 gemma gemma2; do
    f=tests/fixtures/models/$v
    $loom forward --model $f --adapter $f/adapter --input $f/inputs.safetensors --output /tmp/fw_$v.safetensors \
      --save-adapter /tmp/adapter_$v > /dev/null && python3 tools/check_peft_adapter.py /tmp/adapter_$v $f 2>&1 | tail -1
    $loom merge --model $f --adapter $f/adapter --out /tmp/merged_$v --device cuda > /dev/null &&
      python3 tools/check_merged.py /tmp/merged_$v $f 2>&1 | tail -2
  done
} 2>&1 | tee "$out/interop.log"
if [[ "${LOOM_SKIP_LOAD_BENCH:-0}" != 1 ]]; then
  python3 tools/make_big_checkpoint.py /tmp/llama8b > /dev/null && build-gpu/bench/loom_load_bench /tmp/llama8b 2>&1 | tee "$out/load_bench.log"
  rm -rf /tmp/llama8b
fi
