#!/usr/bin/env python3
"""Writes a Llama-3-8B-shaped Hugging Face checkpoint with placeholder values (bf16, sharded like
the hub's) for timing Loom's checkpoint loading: python3 tools/gpu/make_big_checkpoint.py OUT_DIR
[--layers N]. Needs torch and safetensors (the GPU machine has both)."""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--layers", type=int, default=32)
p.add_argument("--shard-gb", type=float, default=5.0)
a = p.parse_args()
os.makedirs(a.out, exist_ok=True)
H, I, V, NH, NKV, D = 4096, 14336, 128256, 32, 8, 128
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
          "intermediate_size": I, "num_hidden_layers": a.layers, "num_attention_heads": NH,
          "num_key_value_heads": NKV, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
          "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}
json.dump(config, open(os.path.join(a.out, "config.json"), "w"), indent=2)
shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
for i in range(a.layers):
    p_ = f"model.layers.{i}."
    shapes.update({p_ + "input_layernorm.weight": (H,), p_ + "post_attention_layernorm.weight": (H,),
                   p_ + "self_attn.q_proj.weight": (NH * D, H), p_ + "self_attn.k_proj.weight": (NKV * D, H),
                   p_ + "self_attn.v_proj.weight": (NKV * D, H), p_ + "self_attn.o_proj.weight": (H, NH * D),
                   p_ + "mlp.gate_proj.weight": (I, H), p_ + "mlp.up_proj.weight": (I, H),
                   p_ + "mlp.down_proj.weight": (H, I)})
shards, cur, size = [], {}, 0
for name, shape in shapes.items():
    n = 1
    for s in shape:
        n *= s
    if size + 2 * n > a.shard_gb * 1e9 and cur:
        shards.append(cur)
        cur, size = {}, 0
    cur[name] = shape
    size += 2 * n
shards.append(cur)
weight_map = {}
for k, shard in enumerate(shards):
    fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
    tensors = {name: torch.full(shape, 0.01, dtype=torch.bfloat16) for name, shape in shard.items()}
    save_file(tensors, os.path.join(a.out, fname), metadata={"format": "pt"})
    weight_map.update({name: fname for name in shard})
    print(f"wrote {fname}", flush=True)
json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(a.out, "model.safetensors.index.json"), "w"))
