#!/usr/bin/env python3
"""Checks a `loom export` .gguf file with the independent `gguf` package (llama.cpp's gguf-py).

    python3 tools/check/check_gguf_export.py --gguf out.gguf --model HF_DIR [--adapter PEFT_DIR] --type f16|bf16|q8_0

Reads the file with gguf.GGUFReader and compares it with the Hugging Face folder it came from, all
computed here in numpy without Loom: tensor names (llama.cpp's), ggml shapes and types (matrices of
--type, norms and biases F32), the values dequantised by gguf.quants.dequantize against the source
safetensors with the PEFT adapter merged here in float64 (W + scale * B @ A) and q/k permuted as
convert_hf_to_gguf.py's LlamaModel.permute does (gemma3: names from gguf-py's TensorNameMap, norms
stored as 1 + w as its Gemma3Model does); the general.* / <arch>.* metadata against
config.json; tokenizer.ggml.* against tokenizer.json / tokenizer_config.json; 32-byte alignment.
Mixture of experts (mixtral as `llama`, qwen3_moe as `qwen3moe`; tools/reference/moe_formats.md (e)): the
per-expert tensors stacked over the expert index as convert_hf_to_gguf.py stacks them (a 5.x fused
gate_up_proj split at row I), named by gguf-py's TensorNameMap, the router F32, the expert keys.
Tolerances: without an adapter F16/BF16 must equal the round-to-nearest-even rounding of the f32
source exactly and Q8_0 must equal gguf-py's own Q8_0 quantisation bit for bit; with an adapter the
merge is f32 in Loom and f64 here, so each value must lie within half a unit in the last place of
its type (Q8_0: half a quantisation step) of the f64 merge, plus the f32 merge's rounding bound.
Exit 0 when everything matches; 1 with a list of what does not.
"""
import argparse
import importlib.metadata
import json
import os
import re
import struct
import sys

import numpy as np
import gguf

failures = []
MOE = False  # the source is a mixture-of-experts family (EXPERTS)


def fail(msg):
    failures.append(msg)


def read_safetensors(path):
    out = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            f.seek(base + a)
            raw = f.read(b - a)
            dt = info["dtype"]
            if dt == "F32":
                arr = np.frombuffer(raw, dtype="<f4")
            elif dt == "F16":
                arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
            elif dt == "BF16":
                arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                raise SystemExit(f"{path}: tensor {name} has dtype {dt}")
            out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def read_model(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
        tensors = {}
        for f in files:
            tensors.update(read_safetensors(os.path.join(d, f)))
        return tensors
    return read_safetensors(os.path.join(d, "model.safetensors"))


def merge(tensors, adapter_dir):
    """W + scale * B @ A in float64 for every adapted module (PEFT names)."""
    cfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / (r ** 0.5) if cfg.get("use_rslora") else alpha / r
    ad = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    merged = {k: v.astype(np.float64) for k, v in tensors.items()}
    bound = {}
    prefix = "base_model.model."
    for name, a in ad.items():
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[len(prefix):-len(".lora_A.weight")]
        b = ad[name.replace("lora_A", "lora_B")].astype(np.float64)
        w = module + ".weight"
        merged[w] = merged[w] + scale * (b @ a.astype(np.float64))
        # f32 merge error bound: r products and sums plus the add, each within 2^-24 relative.
        bound[w] = (np.abs(tensors[w]) + scale * (np.abs(b) @ np.abs(a.astype(np.float64)))) * (r + 2) * 2.0 ** -24
    return merged, bound


def permute(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}


# The Hugging Face modules of a MoE family's experts: where they sit, and gate, up, down (hub names).
EXPERTS = {"mixtral": ("block_sparse_moe.experts", "w1", "w3", "w2"),
           "qwen3_moe": ("mlp.experts", "gate_proj", "up_proj", "down_proj")}


def stack_experts(tensors, model_type):
    """convert_hf_to_gguf.py's stacking: model.layers.L.<experts>.<e>.<part>.weight -> [E, ...] under
    model.layers.L.<experts>.<part>.weight (torch.stack over e); a 5.x fused mlp.experts.gate_up_proj
    [E, 2I, H] split at row I into gate and up, mlp.experts.down_proj as down."""
    where, gate, up, down = EXPERTS[model_type]
    per_expert = re.compile(r"(model\.layers\.\d+)\." + re.escape(where) + r"\.(\d+)\.(\w+)\.weight")
    fused = re.compile(r"(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")
    out, groups = {}, {}
    for name, t in tensors.items():
        if m := per_expert.fullmatch(name):
            groups.setdefault(f"{m[1]}.{where}.{m[3]}.weight", {})[int(m[2])] = t
        elif m := fused.fullmatch(name):
            if m[2] == "down_proj":
                out[f"{m[1]}.{where}.{down}.weight"] = t
            else:
                i = t.shape[1] // 2
                out[f"{m[1]}.{where}.{gate}.weight"] = np.ascontiguousarray(t[:, :i, :])
                out[f"{m[1]}.{where}.{up}.weight"] = np.ascontiguousarray(t[:, i:, :])
        else:
            out[name] = t
    for key, by_e in groups.items():
        if sorted(by_e) != list(range(len(by_e))):
            fail(f"{key}: experts {sorted(by_e)} are not 0..{len(by_e) - 1}")
            continue
        out[key] = np.stack([by_e[e] for e in range(len(by_e))])
    return out


def gguf_name(hf, arch, n_layers):
    stem, suffix = hf.rsplit(".", 1)
    if arch == "gemma3" or MOE:  # gguf-py's own map for the architecture
        model_arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
        name = gguf.TensorNameMap(model_arch, n_layers).get_name(stem)
        if name is None:
            fail(f"{hf}: gguf-py has no {arch} name for it")
            return hf
        return f"{name}.{suffix}"
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if stem in top:
        return f"{top[stem]}.{suffix}"
    parts = stem.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf
    return f"blk.{parts[2]}.{LAYER_NAMES['.'.join(parts[3:])]}.{suffix}"


def round_bf16(x32):
    u = x32.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def ulp_half(x, kind):
    """Half a unit in the last place of |x| in f16 or bf16."""
    a = np.abs(x).astype(np.float64)
    mant = 10 if kind == "f16" else 7
    min_exp = -14 if kind == "f16" else -126
    e = np.floor(np.log2(np.maximum(a, 2.0 ** min_exp)))
    return 0.5 * 2.0 ** (e - mant)


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def check_metadata(reader, cfg, arch):
    want = {
        "general.architecture": arch,
        "general.alignment": 32,
        f"{arch}.block_count": cfg["num_hidden_layers"],
        f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.feed_forward_length": cfg["intermediate_size"],
        f"{arch}.attention.head_count": cfg["num_attention_heads"],
        f"{arch}.attention.head_count_kv": cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        f"{arch}.context_length": cfg["max_position_embeddings"],
    }
    if MOE:  # TextModel: expert counts; Qwen2MoeModel: the experts' width (Mixtral's is feed_forward_length)
        want[f"{arch}.expert_count"] = cfg.get("num_local_experts") or cfg.get("num_experts")
        want[f"{arch}.expert_used_count"] = cfg["num_experts_per_tok"]
        want[f"{arch}.expert_feed_forward_length"] = cfg.get("moe_intermediate_size")
    for k, v in want.items():
        got = field(reader, k)
        if got != v:
            fail(f"metadata {k}: {got!r}, expected {v!r}")
    eps = field(reader, f"{arch}.attention.layer_norm_rms_epsilon")
    if eps is None or np.float32(eps) != np.float32(cfg["rms_norm_eps"]):
        fail(f"metadata rms eps {eps}, expected {cfg['rms_norm_eps']}")
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # Gemma 3 (5.x): one dict per layer type
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    got_theta = field(reader, f"{arch}.rope.freq_base")
    if got_theta is None or np.float32(got_theta) != np.float32(theta):
        fail(f"metadata rope.freq_base {got_theta}, expected {theta}")
    if arch == "gemma3":  # convert_hf_to_gguf.py's Gemma3Model (and TextModel's rope scaling)
        scaling = rope if "rope_type" in rope else (cfg.get("rope_scaling") or {})
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        head_dim = cfg.get("head_dim", 256)
        sliding = "sliding_attention" in cfg.get("layer_types", ["sliding_attention"])
        want = {f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim,
                f"{arch}.attention.sliding_window": cfg["sliding_window"] if sliding else None,
                f"{arch}.rope.scaling.type": "linear" if kind == "linear" else None}
        for k, v in want.items():
            if field(reader, k) != v:
                fail(f"metadata {k}: {field(reader, k)!r}, expected {v!r}")
        factor = field(reader, f"{arch}.rope.scaling.factor")
        if kind == "linear" and (factor is None or np.float32(factor) != np.float32(scaling["factor"])):
            fail(f"metadata rope.scaling.factor {factor}, expected {scaling['factor']}")


def check_tokenizer(reader, d, vocab_size):
    tj_path = os.path.join(d, "tokenizer.json")
    if not os.path.exists(tj_path):
        fail(f"{tj_path}: missing")
        return
    tj = json.load(open(tj_path))
    tc_path = os.path.join(d, "tokenizer_config.json")
    tc = json.load(open(tc_path)) if os.path.exists(tc_path) else {}
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    if field(reader, "tokenizer.ggml.model") != "gpt2":
        fail("tokenizer.ggml.model is not gpt2")
    if not field(reader, "tokenizer.ggml.pre"):
        fail("no tokenizer.ggml.pre")
    if tokens is None or len(tokens) != vocab_size:
        fail(f"tokenizer.ggml.tokens: {None if tokens is None else len(tokens)} tokens for vocab {vocab_size}")
        return
    want = {i: (t, 1) for t, i in tj["model"]["vocab"].items()}
    for a in tj.get("added_tokens", []):
        want[a["id"]] = (a["content"], 3 if a.get("special") else 4)
    for i in range(vocab_size):
        t, ty = want.get(i, (f"[PAD{i}]", 5))
        if tokens[i] != t or types[i] != ty:
            fail(f"token {i}: {tokens[i]!r} type {types[i]}, expected {t!r} type {ty}")
            break
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"].get("merges", [])]
    if field(reader, "tokenizer.ggml.merges") != merges:
        fail("tokenizer.ggml.merges differ from tokenizer.json's")
    for key, name in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "padding_token_id")):
        v = tc.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v:
            got = field(reader, f"tokenizer.ggml.{name}")
            if got is None or tokens[got] != v:
                fail(f"tokenizer.ggml.{name} = {got}, expected the id of {v!r}")
    tmpl = tc.get("chat_template")
    if isinstance(tmpl, str) and field(reader, "tokenizer.chat_template") != tmpl:
        fail("tokenizer.chat_template differs from tokenizer_config.json's")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter")
    ap.add_argument("--type", required=True, choices=["f16", "bf16", "q8_0"])
    args = ap.parse_args()

    cfg = json.load(open(os.path.join(args.model, "config.json")))
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
            "gemma3_text": "gemma3", "mixtral": "llama", "qwen3_moe": "qwen3moe"}[cfg["model_type"]]
    global MOE
    MOE = cfg["model_type"] in EXPERTS
    src = read_model(args.model)
    if MOE:
        if args.adapter and json.load(open(os.path.join(args.adapter, "adapter_config.json"))).get("target_parameters"):
            raise SystemExit(f"{args.adapter}: LoRA on experts (target_parameters) is not merged by this script")
        src = stack_experts(src, cfg["model_type"])
    if args.adapter:
        merged, bound = merge(src, args.adapter)
    else:
        merged, bound = {k: v.astype(np.float64) for k, v in src.items()}, {}
    if cfg.get("tie_word_embeddings") and "lm_head.weight" in merged:
        del merged["lm_head.weight"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head

    reader = gguf.GGUFReader(args.gguf)
    check_metadata(reader, cfg, arch)
    check_tokenizer(reader, args.model, cfg["vocab_size"])
    by_name = {t.name: t for t in reader.tensors}
    matrix_type = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
                   "q8_0": gguf.GGMLQuantizationType.Q8_0}[args.type]
    seen = set()
    worst = 0.0
    for hf, w64 in sorted(merged.items()):
        name = gguf_name(hf, arch, cfg["num_hidden_layers"])
        seen.add(name)
        t = by_name.get(name)
        if t is None:
            fail(f"{name} ({hf}) missing")
            continue
        if int(t.data_offset) % 32:
            fail(f"{name}: data offset {t.data_offset} not 32-aligned")
        if list(t.shape) != list(reversed(w64.shape)):
            fail(f"{name}: ggml shape {list(t.shape)}, expected {list(reversed(w64.shape))}")
            continue
        w32 = src[hf]
        b = bound.get(hf, np.zeros_like(w64))
        if arch == "llama" and ".attn_q." in name:
            w64, w32, b = permute(w64, n_head), permute(w32, n_head), permute(b, n_head)
        if arch == "llama" and ".attn_k." in name:
            w64, w32, b = permute(w64, n_kv), permute(w32, n_kv), permute(b, n_kv)
        if arch == "gemma3" and hf.endswith("norm.weight"):  # Gemma3Model stores 1 + w, added in f32
            w32 = w32.astype(np.float32) + np.float32(1)
            w64 = w32.astype(np.float64)
        # convert_hf_to_gguf.py: vectors, norms and the MoE router F32; Q8_0 rows not whole blocks F16.
        want_type = matrix_type if w64.ndim >= 2 and not name.endswith(".ffn_gate_inp.weight") \
            else gguf.GGMLQuantizationType.F32
        if want_type == gguf.GGMLQuantizationType.Q8_0 and w64.shape[-1] % 32:
            want_type = gguf.GGMLQuantizationType.F16
        if t.tensor_type != want_type:
            fail(f"{name}: type {t.tensor_type.name}, expected {want_type.name}")
            continue
        got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(w64.shape).astype(np.float64)
        exact = not args.adapter or hf not in bound
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            ok = np.array_equal(got, w64) if exact else np.all(np.abs(got - w64) <= b + 2.0 ** -24 * np.abs(w64))
        elif t.tensor_type == gguf.GGMLQuantizationType.F16:
            ok = np.array_equal(got, w32.astype(np.float16).astype(np.float64)) if exact else \
                np.all(np.abs(got - w64) <= ulp_half(w64, "f16") * (1 + 1e-9) + b)
        elif t.tensor_type == gguf.GGMLQuantizationType.BF16:
            ok = np.array_equal(got, round_bf16(w32).astype(np.float64)) if exact else \
                np.all(np.abs(got - w64) <= ulp_half(w64, "bf16") * (1 + 1e-9) + b)
        else:  # Q8_0
            if exact:
                ref = gguf.quants.quantize(w32.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
                ok = np.array_equal(np.asarray(t.data).reshape(-1).view(np.uint8), np.asarray(ref).reshape(-1).view(np.uint8))
            else:
                blocks = w64.reshape(-1, 32)
                d = (np.abs(blocks).max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float64)
                # half a step of the stored scale, plus the scale's own f16 rounding times 127, plus the f32 merge
                tol = 0.5 * d + 127 * ulp_half(d, "f16") + b.reshape(-1, 32).max(axis=1, keepdims=True)
                ok = np.all(np.abs(got.reshape(-1, 32) - blocks) <= tol * (1 + 1e-9))
        err = float(np.max(np.abs(got - w64))) if got.size else 0.0
        worst = max(worst, err)
        if not ok:
            fail(f"{name}: values differ (max |file - source| = {err:.3g})")
    extra = set(by_name) - seen
    if extra:
        fail(f"tensors with no source: {sorted(extra)}")
    if failures:
        print(f"check_gguf_export: {args.gguf}: {len(failures)} problem(s):")
        for f in failures[:30]:
            print("  " + f)
        return 1
    print(f"check_gguf_export: {args.gguf}: {len(by_name)} tensors, metadata and tokenizer match "
          f"(gguf {importlib.metadata.version('gguf')}; max |file - merged source| = {worst:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
