#!/usr/bin/env python3
"""The mixture-of-experts shapes of bench/e2e/moe.sh, their active-parameter counts, and a writer of a
random-init Hugging Face folder of one of them (what Loom, PEFT + bitsandbytes and Unsloth load).

    python3 bench/e2e/moe_model.py SHAPE OUT_DIR [--layers N] [--seed 0] [--device cuda|cpu]
    python3 bench/e2e/moe_model.py SHAPE --config-only OUT_DIR [--layers N]   (config.json + tokenizer.json)
    python3 bench/e2e/moe_model.py SHAPE --info [--layers N]                  (sizes as one JSON line)

The folder is what transformers 5.x's save_pretrained writes for these families (per-expert hub names:
Qwen3-MoE `mlp.experts.E.{gate,up,down}_proj`, Mixtral `block_sparse_moe.experts.E.w1/w3/w2`, see
tools/reference/moe_formats.md), bf16, sharded with model.safetensors.index.json, every matrix N(0, 0.02) (the
router too), norms 1, drawn on DEVICE (the GPU on the GPU machine: seconds, not minutes) from one seeded
generator in a fixed order: the same bytes every time. It is built here rather than by `loom init`
because init_random builds the whole model in f32 on the host before writing (the 30B shape would need
~122 GB of host memory) and writes it as one file. Written under a temporary name, renamed when
complete; refused (exit 3, a message) when the disk has not room for it plus 2 GB.
"""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "examples/demo/model-config/tokenizer.json"  # ids < 1207: every shape's vocabulary holds them

_QWEN3_30B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
              "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
              "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "router_aux_loss_coef": 0.001, "output_router_logits": False, "rope_theta": 1000000.0,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "tie_word_embeddings": False,
              "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "hidden_act": "silu",
              "initializer_range": 0.02, "bos_token_id": 1202, "eos_token_id": 1203, "torch_dtype": "bfloat16"}
_MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000,
                 "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 8, "num_experts_per_tok": 2,
                 "router_aux_loss_coef": 0.001, "output_router_logits": False, "router_jitter_noise": 0.0,
                 "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 32768,
                 "sliding_window": None, "tie_word_embeddings": False, "hidden_act": "silu", "initializer_range": 0.02,
                 "bos_token_id": 1202, "eos_token_id": 1203, "torch_dtype": "bfloat16"}

# Per shape: the config, the micro-batch of 2048-token rows (LOOM_MOE_BATCH overrides) and what the name stands for.
SHAPES = {
    "qwen3moe30b": dict(config=_QWEN3_30B, batch=4, title="Qwen3-30B-A3B"),
    "mixtral8x7b": dict(config=_MIXTRAL_8X7B, batch=4, title="Mixtral-8x7B"),
    # 4 layers of the 30B shape, every width real: the quick check on the GPU machine (~6 GB).
    "qwen3moe_smoke": dict(config=dict(_QWEN3_30B, num_hidden_layers=4), batch=4, title="Qwen3-30B-A3B, 4 layers"),
    # Toy widths: the CPU check of the scripts themselves (both families' code paths).
    "qwen3moe_tiny": dict(config=dict(_QWEN3_30B, vocab_size=1280, hidden_size=64, intermediate_size=192,
                                      moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2),
                          batch=2, title="Qwen3-MoE toy"),
    "mixtral_tiny": dict(config=dict(_MIXTRAL_8X7B, vocab_size=1280, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     num_local_experts=4, num_experts_per_tok=2),
                         batch=2, title="Mixtral toy"),
}


def config(shape, layers=None):
    c = dict(SHAPES[shape]["config"])
    if layers:
        c["num_hidden_layers"] = int(layers)
    return c


def _dims(c):
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // heads
    experts = c.get("num_experts") or c.get("num_local_experts")
    width = c.get("moe_intermediate_size") or c["intermediate_size"]
    return h, heads * d, kv * d, experts, c["num_experts_per_tok"], width


def tensors(c):
    """(name, shape) of every tensor of the folder, in the order they are drawn and written."""
    h, q, kv, experts, _, width = _dims(c)
    qwen = c["model_type"] == "qwen3_moe"
    out = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q))]
        if qwen:
            hd = q // c["num_attention_heads"]
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
            moe = f"{p}mlp."
            names = ("gate_proj", "up_proj", "down_proj")
        else:
            moe = f"{p}block_sparse_moe."
            names = ("w1", "w3", "w2")
        out.append((moe + "gate.weight", (experts, h)))
        for e in range(experts):
            out += [(f"{moe}experts.{e}.{names[0]}.weight", (width, h)), (f"{moe}experts.{e}.{names[1]}.weight", (width, h)),
                    (f"{moe}experts.{e}.{names[2]}.weight", (h, width))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (c["vocab_size"], h))]
    return out


def info(shape, layers=None):
    """Sizes: total parameters, active parameters a token (attention + router + top-k experts a layer, plus
    lm_head once: the dense table's count, embeddings being a lookup), and the attention width for its FLOPs."""
    c = config(shape, layers)
    h, q, kv, experts, k, width = _dims(c)
    L = c["num_hidden_layers"]
    attention = 2 * h * q + 2 * h * kv
    total = sum(_numel(s) for _, s in tensors(c))
    active = L * (attention + experts * h + k * 3 * h * width) + c["vocab_size"] * h
    return dict(shape=shape, layers=L, full_layers=SHAPES[shape]["config"]["num_hidden_layers"], total_params=total,
                active_params=active, q_width=q, bf16_bytes=2 * total, experts=experts, top_k=k, hidden=h,
                expert_width=width, vocab=c["vocab_size"], title=SHAPES[shape]["title"])


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def write_config(c, out):
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    shutil.copy(TOKENIZER, out / "tokenizer.json")


def write_model(shape, out, layers=None, seed=0, device="cpu", shard_bytes=4 << 30):
    import torch
    from safetensors.torch import save_file

    c = config(shape, layers)
    out = Path(out)
    if (out / "model.safetensors.index.json").exists():
        return
    need = info(shape, layers)["bf16_bytes"]
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if free < need + (2 << 30):
        print(f"moe_model.py: {shape} with {c['num_hidden_layers']} layers needs {need / 2**30:.1f} GiB, "
              f"{out.parent} has {free / 2**30:.1f} GiB free: fewer layers (LOOM_MOE_LAYERS)", file=sys.stderr)
        sys.exit(3)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write_config(c, tmp)
    gen = torch.Generator(device=device).manual_seed(seed)
    shard, size, files, weight_map = {}, 0, [], {}

    def flush():
        nonlocal shard, size
        if shard:
            name = f"part-{len(files):05d}.safetensors"
            save_file(shard, str(tmp / name), metadata={"format": "pt"})
            files.append(name)
            weight_map.update({k: name for k in shard})
            shard, size = {}, 0

    for name, s in tensors(c):
        if len(s) == 1:  # the norms: ones
            t = torch.ones(s, dtype=torch.bfloat16)
        else:
            t = torch.empty(s, dtype=torch.float32, device=device).normal_(0.0, 0.02, generator=gen)
            t = t.to(torch.bfloat16).cpu()
        if size + 2 * t.numel() > shard_bytes:
            flush()
        shard[name] = t
        size += 2 * t.numel()
    flush()
    # Shards renamed to the hub's model-0000i-of-0000n.safetensors pattern now that n is known.
    final = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
    for f, g in final.items():
        os.rename(tmp / f, tmp / g)
    (tmp / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": need}, "weight_map": {k: final[v] for k, v in weight_map.items()}}, indent=1))
    os.rename(tmp, out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("out", nargs="?")
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--config-only", action="store_true")
    p.add_argument("--info", action="store_true")
    a = p.parse_args()
    if a.info:
        print(json.dumps(info(a.shape, a.layers or None)))
    elif a.config_only:
        write_config(config(a.shape, a.layers or None), Path(a.out))
    else:
        write_model(a.shape, a.out, a.layers or None, a.seed, a.device)
        print(a.out)


if __name__ == "__main__":
    main()
