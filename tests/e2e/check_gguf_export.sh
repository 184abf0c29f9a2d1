#!/usr/bin/env bash
# CTest e2e_gguf_export_gguf_py: `loom export` files checked by tools/check/check_gguf_export.py with the
# independent `gguf` Python package (exit 77 = skipped when it is not importable). Sources: the tiny
# llama GGUF fixture converted to a Hugging Face folder (no adapter: values must be exact), and the
# mistral / qwen2 / qwen3 fixtures with their PEFT adapters merged, given that folder's tokenizer; the
# gemma3 fixture changed as llama.cpp's gemma3 can hold it (both layers sliding, query_pre_attn_scalar
# = head_dim; tests/models/fixtures.h gemma3_llama_cpp_patch), with and without its adapter; the mixtral
# and qwen3_moe fixtures (qwen3_moe with norm_topk_prob true, as llama.cpp's qwen3moe computes it),
# without adapters (the script does not merge LoRA on experts).
set -euo pipefail
loom=$1
src=$2
if ! python3 -c "import gguf, numpy" 2>/dev/null; then
  echo "skipped: the gguf Python package is not importable (pip install gguf)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$loom" convert --gguf "$src/tests/fixtures/gguf/tiny_llama.gguf" --out "$tmp/tiny" --dtype f32
check() {  # model adapter-or-empty type
  local out="$tmp/out-$(basename "$1")${2:+-lora}-$3.gguf" adapter=()
  [ -n "$2" ] && adapter=(--adapter "$2")
  "$loom" export --model "$1" "${adapter[@]}" --out "$out" --type "$3"
  python3 "$src/tools/check/check_gguf_export.py" --gguf "$out" --model "$1" "${adapter[@]}" --type "$3"
}
for type in f16 bf16 q8_0; do
  check "$tmp/tiny" "" $type
  for family in mistral qwen2 qwen3; do
    mkdir -p "$tmp/$family"
    cp "$src/tests/fixtures/models/$family"/{config.json,model.safetensors} "$tmp/tiny"/tokenizer*.json "$tmp/$family/"
    check "$tmp/$family" "$src/tests/fixtures/models/$family/adapter" $type
  done
  mkdir -p "$tmp/gemma3"
  cp "$src/tests/fixtures/models/gemma3/model.safetensors" "$tmp/tiny"/tokenizer*.json "$tmp/gemma3/"
  python3 - "$src/tests/fixtures/models/gemma3/config.json" "$tmp/gemma3/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(layer_types=["sliding_attention"] * 2, sliding_window_pattern=6, query_pre_attn_scalar=16)
c.pop("_sliding_window_pattern", None)
json.dump(c, open(sys.argv[2], "w"))
EOF
  check "$tmp/gemma3" "" $type
  check "$tmp/gemma3" "$src/tests/fixtures/models/gemma3/adapter" $type
  for family in mixtral qwen3_moe; do
    mkdir -p "$tmp/$family"
    cp "$src/tests/fixtures/models/$family/model.safetensors" "$tmp/tiny"/tokenizer*.json "$tmp/$family/"
    python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c.update({"norm_topk_prob": True} if "norm_topk_prob" in c else {}); json.dump(c, open(sys.argv[2], "w"))' \
      "$src/tests/fixtures/models/$family/config.json" "$tmp/$family/config.json"
    check "$tmp/$family" "" $type
  done
done
