#!/usr/bin/env bash
# CTest e2e_gguf_spm_transformers: `loom convert` of the SentencePiece GGUF fixtures (llama, gemma2), each folder loaded
# by transformers (tools/check/check_hf_tokenizer.py) must encode, decode and render the chat template as
# transformers does from the GGUF itself (exit 77 = skipped when transformers is not importable).
set -euo pipefail
loom=$1
src=$2
if ! python3 -c "import transformers, tokenizers" 2>/dev/null; then
  echo "skipped: transformers is not importable (pip install transformers)"
  exit 77
fi
# transformers 4.x builds these tokenizers differently from the 5.x that made the references (a
# Prepend normalizer instead of Metaspace; Gemma merges by score): nothing to compare against.
want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['versions']['transformers'])" \
  "$src/tests/fixtures/gguf/spm_llama.reference.json")
have=$(python3 -c "import transformers; print(transformers.__version__)")
if [ "${want%%.*}" != "${have%%.*}" ]; then
  echo "skipped: the references were made by transformers $want, this is $have (another major version)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in spm_llama spm_gemma; do
  "$loom" convert --gguf "$src/tests/fixtures/gguf/$name.gguf" --out "$tmp/$name" --dtype f32
  python3 "$src/tools/check/check_hf_tokenizer.py" --model "$tmp/$name" --reference "$src/tests/fixtures/gguf/$name.reference.json"
done
