# Sourced by bench/e2e/run.sh and tools/gpu/gpu_qlora_check.sh, from the project root, with $loom (the
# loom binary) and $work (a scratch folder) set.
# The random-init models (`loom init --seed 0`, the same bytes every time) are kept across calls on a
# machine that stays warm: LOOM_E2E_CACHE (default /tmp/loom-e2e); written under a temporary name.
cache=${LOOM_E2E_CACHE:-/tmp/loom-e2e}
model_dir() {  # $1: 1b | 8b | 70b | phi35 | gemma3_4b -> a random-init bf16 Hugging Face folder that both Loom and the peers read
  local shape=$1 d="$cache/model-$1" cfg
  [ -d "$d" ] && { echo "$d"; return; }
  mkdir -p "$cache"
  cfg=$(config_dir "$shape") || return 1
  "$loom" init --from "$cfg" --out "$d.tmp$$" --seed 0 > /dev/null && mv "$d.tmp$$" "$d" || return 1
  echo "$d"
}

config_dir() {  # $1: a shape -> $work/cfg-<shape>: its config.json and the demo tokenizer (for loom train --random-init)
  local shape=$1
  [ -f "$work/cfg-$shape/config.json" ] && { echo "$work/cfg-$shape"; return; }
  mkdir -p "$work/cfg-$shape"
  case $shape in
    phi35)  # Phi-3.5-mini-instruct's shape: fused projections, LongRoPE (2048 < 4096: the short factors)
      python3 - "$work/cfg-$shape/config.json" <<'PY'
import json, sys
f = [1.0 + 0.05 * i for i in range(48)]
json.dump({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
           "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
           "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "rope_scaling": {"type": "longrope", "short_factor": f, "long_factor": [x * 2 for x in f]},
           "sliding_window": 262144, "tie_word_embeddings": False, "hidden_act": "silu",
           "bos_token_id": 1202, "eos_token_id": 1203, "pad_token_id": 1203, "torch_dtype": "bfloat16"},
          open(sys.argv[1], "w"))
PY
      ;;
    gemma3_4b)  # Gemma-3-4B's language model: head dim 256, 5 sliding layers (window 1024) per full one, 262k vocab
      cat > "$work/cfg-$shape/config.json" <<JSON
{"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2560,
 "intermediate_size": 10240, "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
 "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 1024, "sliding_window_pattern": 6,
 "rope_theta": 1000000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_local_base_freq": 10000.0,
 "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
 "max_position_embeddings": 131072, "final_logit_softcapping": null, "attn_logit_softcapping": null,
 "bos_token_id": 1202, "eos_token_id": 1203, "pad_token_id": 1203, "torch_dtype": "bfloat16"}
JSON
      ;;
    *)
  heads=32
  if [ "$shape" = 8b ]; then h=4096 i=14336 l=32 tied=false
  elif [ "$shape" = 70b ]; then h=8192 i=28672 l=80 tied=false heads=64  # Llama-3-70B
  else h=2048 i=8192 l=16 tied=true; fi
  cat > "$work/cfg-$shape/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": $h,
 "intermediate_size": $i, "num_hidden_layers": $l, "num_attention_heads": $heads, "num_key_value_heads": 8,
 "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": $tied,
 "bos_token_id": 1202, "eos_token_id": 1203, "torch_dtype": "bfloat16"}
JSON
      ;;
  esac
  cp examples/demo/model-config/tokenizer.json "$work/cfg-$shape/"
  echo "$work/cfg-$shape"
}

