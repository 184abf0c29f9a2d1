#!/usr/bin/env bash
# CTest e2e_gguf_export_gguf_py: `loom export` files checked by tools/check_gguf_export.py with the
# independent `gguf` Python package (exit 77 = skipped when it is not importable). Sources: the tiny
# llama GGUF fixture converted to a Hugging Face folder (no adapter: values must be exact), and the
# mistral / qwen2 / qwen3 fixtures with their PEFT adapters merged, given that folder's tokenizer.
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
  local out="$tmp/out-$(basename "$1")-$3.gguf" adapter=()
  [ -n "$2" ] && adapter=(--adapter "$2")
  "$loom" export --model "$1" "${adapter[@]}" --out "$out" --type "$3"
  python3 "$src/tools/check_gguf_export.py" --gguf "$out" --model "$1" "${adapter[@]}" --type "$3"
}
for type in f16 bf16 q8_0; do
  check "$tmp/tiny" "" $type
  for family in mistral qwen2 qwen3; do
    mkdir -p "$tmp/$family"
    cp "$src/tests/fixtures/models/$family"/{config.json,model.safetensors} "$tmp/tiny"/tokenizer*.json "$tmp/$family/"
    check "$tmp/$family" "$src/tests/fixtures/models/$family/adapter" $type
  done
done
