#!/usr/bin/env bash
# CTest e2e_gguf_gemma3_transformers: the gemma3 fixture changed as llama.cpp's gemma3 can hold it
# (tests/models/fixtures.h gemma3_llama_cpp_patch), `loom export`ed with its adapter and `loom
# convert`ed back: transformers' AutoConfig reads the converted config.json as the same
# Gemma3TextConfig as the source's (layer types, window, both RoPEs, attention scale, soft-caps,
# tying, activation, sizes). No torch needed; exit 77 = skipped when transformers is not importable.
set -euo pipefail
loom=$1
src=$2
if ! python3 -c "import transformers" 2>/dev/null; then
  echo "skipped: transformers is not importable (pip install transformers)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$loom" convert --gguf "$src/tests/fixtures/gguf/tiny_llama.gguf" --out "$tmp/tiny" --dtype f32 >/dev/null
mkdir "$tmp/src"
cp "$src/tests/fixtures/models/gemma3/model.safetensors" "$tmp/tiny"/tokenizer*.json "$tmp/src/"
python3 - "$src/tests/fixtures/models/gemma3/config.json" "$tmp/src/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(layer_types=["sliding_attention"] * 2, sliding_window_pattern=6, query_pre_attn_scalar=16)
c.pop("_sliding_window_pattern", None)
json.dump(c, open(sys.argv[2], "w"))
EOF
"$loom" export --model "$tmp/src" --adapter "$src/tests/fixtures/models/gemma3/adapter" --out "$tmp/g.gguf" --type f16
"$loom" convert --gguf "$tmp/g.gguf" --out "$tmp/back" --dtype f32
python3 - "$tmp/src" "$tmp/back" <<'EOF'
import sys
import transformers
from transformers import AutoConfig
src, back = (AutoConfig.from_pretrained(d) for d in sys.argv[1:3])
bad = [] if type(back).__name__ == "Gemma3TextConfig" else [f"class {type(back).__name__}"]
bad += [] if back.architectures == ["Gemma3ForCausalLM"] else [f"architectures {back.architectures}"]
for key in ["layer_types", "sliding_window", "rope_parameters", "query_pre_attn_scalar", "head_dim",
            "tie_word_embeddings", "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping",
            "rms_norm_eps", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "max_position_embeddings"]:
    a, b = getattr(back, key, None), getattr(src, key, None)
    if a != b:
        bad.append(f"{key}: converted {a!r}, source {b!r}")
if bad:
    print("check_gguf_gemma3_transformers: " + "; ".join(bad))
    sys.exit(1)
print(f"check_gguf_gemma3_transformers: transformers {transformers.__version__} reads the converted config as the source's")
EOF
