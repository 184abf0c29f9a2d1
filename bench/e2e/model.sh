# Sourced by bench/e2e/run.sh and tools/gpu_qlora_check.sh, from the project root, with $loom (the
# loom binary) and $work (a scratch folder) set.
# The random-init models (`loom init --seed 0`, the same bytes every time) are kept across calls on a
# machine that stays warm: LOOM_E2E_CACHE (default /tmp/loom-e2e); written under a temporary name.
cache=${LOOM_E2E_CACHE:-/tmp/loom-e2e}
model_dir() {  # $1: 1b | 8b -> a random-init bf16 Hugging Face folder that both Loom and the peers read
  local shape=$1 d="$cache/model-$1"
  [ -d "$d" ] && { echo "$d"; return; }
  mkdir -p "$cache"
  mkdir -p "$work/cfg-$shape"
  if [ "$shape" = 8b ]; then h=4096 i=14336 l=32 tied=false; else h=2048 i=8192 l=16 tied=true; fi
  cat > "$work/cfg-$shape/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": $h,
 "intermediate_size": $i, "num_hidden_layers": $l, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": $tied,
 "bos_token_id": 1202, "eos_token_id": 1203, "torch_dtype": "bfloat16"}
JSON
  cp examples/demo/model-config/tokenizer.json "$work/cfg-$shape/"
  "$loom" init --from "$work/cfg-$shape" --out "$d.tmp$$" --seed 0 > /dev/null && mv "$d.tmp$$" "$d" || return 1
  echo "$d"
}

