#!/usr/bin/env bash
# CTest e2e_gguf_spm_export: `loom export` of models whose tokenizer.json is SentencePiece-style (the
# llama2, gemma and spm_model tokenizer fixtures, without tokenizer.model) checked by
# tools/check/check_gguf_spm_export.py against gguf-py's LlamaHfVocab and transformers' generate_merges
# (exit 77 = skipped when gguf, transformers, tokenizers or safetensors is not importable). The
# models are the mistral and gemma3 (made llama.cpp-compatible) fixtures with their embedding padded
# to the tokenizer's size.
set -euo pipefail
loom=$1
src=$2
if ! python3 -c "import gguf, numpy, safetensors, tokenizers, transformers" 2>/dev/null; then
  echo "skipped: gguf, numpy, safetensors, tokenizers and transformers are not all importable (pip install gguf transformers)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tok="$src/tests/fixtures/tokenizers"
# model_folder VARIANT TOKENIZER VOCAB TOKENIZER_CONFIG_JSON OUT
model_folder() {
  mkdir -p "$5"
  cp "$tok/$2/tokenizer.json" "$5/"
  [ -f "$tok/$2/chat_template.jinja" ] && cp "$tok/$2/chat_template.jinja" "$5/"
  python3 - "$src/tests/fixtures/models/$1" "$3" "$4" "$5" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file, save_file
fixture, n, tc, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
c = json.load(open(fixture + "/config.json"))
c["vocab_size"] = n
if c["model_type"] == "gemma3_text":  # as llama.cpp's gemma3 holds it (tests/models/fixtures.h gemma3_llama_cpp_patch)
    c.update(layer_types=["sliding_attention"] * 2, sliding_window_pattern=6, query_pre_attn_scalar=16)
    c.pop("_sliding_window_pattern", None)
json.dump(c, open(out + "/config.json", "w"))
t = load_file(fixture + "/model.safetensors")
for k in ("model.embed_tokens.weight", "lm_head.weight"):
    if k in t:
        t[k] = np.concatenate([t[k], np.zeros((n - t[k].shape[0], t[k].shape[1]), t[k].dtype)])
save_file(t, out + "/model.safetensors")
if tc:
    json.dump(tc, open(out + "/tokenizer_config.json", "w"))
PY
}
check() {  # folder texts...
  "$loom" export --model "$1" --out "$1.gguf" --type f16
  python3 "$src/tools/check/check_gguf_spm_export.py" --gguf "$1.gguf" --model "$1" --texts "$tok/corpus.txt" "${@:2}"
}
model_folder mistral llama2 1571 '{"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}' "$tmp/llama2"
check "$tmp/llama2" "$tok/llama2/cases.json"
model_folder gemma3 gemma 1760 '{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}' "$tmp/gemma"
check "$tmp/gemma" "$tok/gemma/cases.json"
model_folder mistral spm_model 704 "$(cat "$tok/spm_model/tokenizer_config.json")" "$tmp/spm_model"
check "$tmp/spm_model"
