#!/usr/bin/env python3
# Makes the reference fixtures for Loom's model tests: tiny random Hugging Face checkpoints, PEFT LoRA adapters
# and the logits / loss / LoRA gradients / one AdamW step that transformers + peft + torch compute for them.
# Run on a machine with torch, transformers (4.x or 5.x), peft and safetensors; see tests/fixtures/models/README.md.
from __future__ import annotations

import argparse
import copy
import inspect
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

# Nothing here may touch the network (the GPU machine has none; PEFT probes the Hub when saving otherwise).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "models"

BATCH, SEQ = 2, 12
# Positions of `labels` set to -100 (transformers shifts labels by one inside the loss, so position 0 never counts).
IGNORED_LABELS = {0: [3, 8], 1: [0, 5, 6, 11]}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PHI3_LORA_TARGETS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]  # Phi-3 keeps q/k/v and gate/up fused
LORA_R, LORA_ALPHA = 8, 16
LORA_B_STD = 0.05
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
# Init scales: logits = normed hidden (O(1)) . lm_head row, so a row std s gives logits std ~ 8 s for hidden 64.
# q/k rows of std 0.2 give attention scores of std ~2.5: peaked attention, so rope, windows and softcaps matter.
STD_EMBED, STD_LM_HEAD, STD_LINEAR, STD_QK, STD_NORM, STD_BIAS = 0.25, 0.2, 0.05, 0.2, 0.1, 0.1

BASE_CONFIG = {
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "use_cache": False,
}


def _cfg(**overrides):
    c = dict(BASE_CONFIG)
    c.update(overrides)
    return c


def _rope(rope_type="default", theta=10000.0, **extra):
    return {"rope_type": rope_type, "rope_theta": float(theta), **extra}


# Each variant: a real transformers architecture. `rope` is written in the transformers 5.x `rope_parameters`
# form and converted to `rope_theta` + `rope_scaling` on 4.x. `norm` is "w" (x_hat * w) or "1+w" (Gemma).
VARIANTS = {
    "llama": dict(
        seed=1, arch="LlamaForCausalLM", config_class="LlamaConfig",
        config=_cfg(tie_word_embeddings=False, rms_norm_eps=1e-5),
        rope=_rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64),
        norm="w", save_dtype="float32", shard=None, use_rslora=False,
        ablations=[("default rope instead of llama3", {"rope": _rope()})]),
    "llama_tied_bf16": dict(
        seed=2, arch="LlamaForCausalLM", config_class="LlamaConfig",
        config=_cfg(tie_word_embeddings=True),
        rope=_rope("linear", factor=2.0),
        norm="w", save_dtype="bfloat16", shard="60KB", use_rslora=False,
        ablations=[("default rope instead of linear x2", {"rope": _rope()})]),
    "mistral": dict(
        seed=3, arch="MistralForCausalLM", config_class="MistralConfig",
        config=_cfg(tie_word_embeddings=False, sliding_window=5),
        rope=_rope(), norm="w", save_dtype="float32", shard=None, use_rslora=False,
        window=dict(layer_types=None, size=5),
        ablations=[("no sliding window", {"config": {"sliding_window": None}})]),
    "qwen2": dict(
        seed=4, arch="Qwen2ForCausalLM", config_class="Qwen2Config",
        config=_cfg(tie_word_embeddings=True, use_sliding_window=False),
        rope=_rope(theta=1000000.0), norm="w", save_dtype="float32", shard=None, use_rslora=True,
        ablations=[]),
    "qwen3": dict(
        seed=5, arch="Qwen3ForCausalLM", config_class="Qwen3Config",
        config=_cfg(tie_word_embeddings=False, head_dim=32, use_sliding_window=False),
        rope=_rope(theta=1000000.0), norm="w", save_dtype="float32", shard=None, use_rslora=False,
        ablations=[]),
    "gemma": dict(
        seed=6, arch="GemmaForCausalLM", config_class="GemmaConfig",
        config=_cfg(tie_word_embeddings=True, head_dim=32, hidden_act="gelu_pytorch_tanh",
                    hidden_activation="gelu_pytorch_tanh"),
        rope=_rope(), norm="1+w", save_dtype="float32", shard=None, use_rslora=False,
        ablations=[]),
    "gemma2": dict(
        seed=7, arch="Gemma2ForCausalLM", config_class="Gemma2Config",
        config=_cfg(tie_word_embeddings=True, head_dim=16, hidden_act="gelu_pytorch_tanh",
                    hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=5.0,
                    final_logit_softcapping=3.0, query_pre_attn_scalar=24, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"]),
        rope=_rope(), norm="1+w", save_dtype="float32", shard=None, use_rslora=False,
        window=dict(layer_types=["sliding_attention"], size=4),
        ablations=[("no attention softcap", {"config": {"attn_logit_softcapping": None}}),
                   ("no final softcap", {"config": {"final_logit_softcapping": None}}),
                   ("sliding window 4096", {"config": {"sliding_window": 4096}})]),
    # Two RoPEs: `rope` on full-attention layers (the global base, linearly scaled as on Gemma 3 4B and up),
    # `rope_local` on sliding ones (5.x: rope_parameters per layer type; 4.x: rope_local_base_freq). A window of 4
    # in 12 tokens makes the sliding layer differ from the full one; q/k norms are (1 + w) like the others.
    "gemma3": dict(
        seed=8, arch="Gemma3ForCausalLM", config_class="Gemma3TextConfig",
        config=_cfg(tie_word_embeddings=True, head_dim=16, hidden_act="gelu_pytorch_tanh",
                    hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, sliding_window=4,
                    sliding_window_pattern=2, layer_types=["sliding_attention", "full_attention"],
                    attn_logit_softcapping=None, final_logit_softcapping=None),
        rope=_rope("linear", theta=1000000.0, factor=8.0), rope_local=_rope(theta=10000.0),
        norm="1+w", save_dtype="float32", shard=None, use_rslora=False,
        window=dict(layer_types=["sliding_attention"], size=4),
        ablations=[("local rope base = the global one", {"rope_local": _rope("linear", theta=1000000.0, factor=8.0)}),
                   ("global rope unscaled", {"rope": _rope(theta=1000000.0)}),
                   ("sliding window 4096", {"config": {"sliding_window": 4096}})]),
    # Phi-3: fused qkv_proj / gate_up_proj (LoRA on the fused modules as PEFT does it), a window of 5 in 12 tokens
    # on every layer (Phi-3-mini-4k has sliding_window 2047).
    "phi3": dict(
        seed=9, arch="Phi3ForCausalLM", config_class="Phi3Config",
        config=_cfg(tie_word_embeddings=False, rms_norm_eps=1e-5, sliding_window=5, pad_token_id=None,
                    bos_token_id=1, eos_token_id=2, original_max_position_embeddings=256),
        rope=_rope(), norm="w", save_dtype="float32", shard=None, use_rslora=False,
        lora_targets=PHI3_LORA_TARGETS, window=dict(layer_types=None, size=5),
        ablations=[("no sliding window", {"config": {"sliding_window": None}})]),
    # LongRoPE with a partial rotary factor (Phi-4-mini rotates 3/4 of a head; here 1/2: 8 of 16 dims, 4 factors).
    # The 12 positions pass original_max_position_embeddings 8: transformers switches to the long factors.
    "phi3_longrope": dict(
        seed=10, arch="Phi3ForCausalLM", config_class="Phi3Config",
        config=_cfg(tie_word_embeddings=True, rms_norm_eps=1e-5, sliding_window=None, pad_token_id=None,
                    bos_token_id=1, eos_token_id=2, max_position_embeddings=64,
                    original_max_position_embeddings=8, partial_rotary_factor=0.5),
        rope=_rope("longrope", theta=10000.0, short_factor=[1.0, 1.3, 2.1, 3.7], long_factor=[1.1, 2.9, 7.3, 19.0]),
        norm="w", save_dtype="float32", shard=None, use_rslora=False, lora_targets=PHI3_LORA_TARGETS,
        ablations=[("all dims rotate", {"config": {"partial_rotary_factor": 1.0},
                                        "rope": _rope("longrope", theta=10000.0, short_factor=[1.0] * 8,
                                                      long_factor=[1.1, 2.9, 7.3, 19.0, 1, 1, 1, 1])}),
                   ("short factors (original 16 > 12 positions)",
                    {"config": {"original_max_position_embeddings": 16}})]),
    # The same below original_max_position_embeddings (16 > 12 positions): the short factors, and attention
    # scaling sqrt(1 + ln(64 / 16) / ln(16)).
    "phi3_longrope_below": dict(
        seed=11, arch="Phi3ForCausalLM", config_class="Phi3Config",
        config=_cfg(tie_word_embeddings=True, rms_norm_eps=1e-5, sliding_window=None, pad_token_id=None,
                    bos_token_id=1, eos_token_id=2, max_position_embeddings=64,
                    original_max_position_embeddings=16, partial_rotary_factor=0.5),
        rope=_rope("longrope", theta=10000.0, short_factor=[1.0, 1.3, 2.1, 3.7], long_factor=[1.1, 2.9, 7.3, 19.0]),
        norm="w", save_dtype="float32", shard=None, use_rslora=False, lora_targets=PHI3_LORA_TARGETS,
        ablations=[("long factors (original 8 < 12 positions)", {"config": {"original_max_position_embeddings": 8}}),
                   ("no attention scaling", {"config": {"max_position_embeddings": 16}})]),
}


# ---------------------------------------------------------------------------------------------------------------
# Pure-python helpers (used by --dry-run too, so no torch here).

def llama3_inv_freq(theta, dim, factor, low_freq_factor, high_freq_factor, old_ctx):
    """Independent llama3 rope formula: returns (inv_freq list, regime per frequency: high/mid/low)."""
    low_wavelen, high_wavelen = old_ctx / low_freq_factor, old_ctx / high_freq_factor
    out, regimes = [], []
    for i in range(dim // 2):
        f = theta ** (-(2.0 * i) / dim)
        wavelen = 2.0 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f), regimes.append("high")
        elif wavelen > low_wavelen:
            out.append(f / factor), regimes.append("low")
        else:
            smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1.0 - smooth) * f / factor + smooth * f), regimes.append("mid")
    return out, regimes


def expected_inv_freq(spec, rope=None):
    rope, head_dim = rope or spec["rope"], spec["config"]["head_dim"]
    head_dim = int(head_dim * spec["config"].get("partial_rotary_factor", 1.0))  # the rotated dims
    default = [rope["rope_theta"] ** (-(2.0 * i) / head_dim) for i in range(head_dim // 2)]
    if rope["rope_type"] == "longrope":  # the table before any forward: the short factors
        return [f / e for f, e in zip(default, rope["short_factor"])], None
    if rope["rope_type"] == "default":
        return default, None
    if rope["rope_type"] == "linear":
        return [f / rope["factor"] for f in default], None
    if rope["rope_type"] == "llama3":
        return llama3_inv_freq(rope["rope_theta"], head_dim, rope["factor"], rope["low_freq_factor"],
                               rope["high_freq_factor"], rope["original_max_position_embeddings"])
    raise ValueError(f"no independent formula for rope_type {rope['rope_type']}")


def print_plan(names):
    for name in names:
        spec = VARIANTS[name]
        print(f"== {name}: {spec['arch']} seed={spec['seed']} save_dtype={spec['save_dtype']} "
              f"shard={spec['shard']} norm={spec['norm']} rslora={spec['use_rslora']}")
        print("   config:", json.dumps(spec["config"], sort_keys=True))
        print("   rope_parameters:", json.dumps(spec["rope"], sort_keys=True))
        inv, regimes = expected_inv_freq(spec)
        print("   inv_freq:", " ".join(f"{f:.4g}" for f in inv))
        if spec.get("rope_local"):
            print("   rope_parameters.sliding_attention:", json.dumps(spec["rope_local"], sort_keys=True))
            print("   sliding inv_freq:", " ".join(f"{f:.4g}" for f in expected_inv_freq(spec, spec["rope_local"])[0]))
        if regimes:
            counts = {r: regimes.count(r) for r in ("high", "mid", "low")}
            print("   llama3 regimes:", counts)
            assert all(counts.values()), f"{name}: every llama3 regime must occur, got {counts}"
        if spec.get("window"):
            print("   window check:", spec["window"])
        for what, _ in spec["ablations"]:
            print("   ablation:", what)


# ---------------------------------------------------------------------------------------------------------------
# Everything below needs torch / transformers / peft; imported in main() only.

torch = transformers = peft = safetensors_torch = None


def tf_major():
    return int(transformers.__version__.split(".")[0])


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def build_config(spec, overrides=None):
    """The transformers config for `spec`, with an ablation's {"config": ..., "rope": ...} applied."""
    overrides = overrides or {}
    kw = dict(spec["config"])
    kw.update(overrides.get("config", {}))
    rope = dict(overrides.get("rope", spec["rope"]))
    rope_local = overrides.get("rope_local", spec.get("rope_local"))
    if tf_major() >= 5:
        kw["rope_parameters"] = ({"full_attention": rope, "sliding_attention": dict(rope_local)} if rope_local
                                 else rope)
    else:
        kw["rope_theta"] = rope.pop("rope_theta")
        if rope["rope_type"] != "default":
            kw["rope_scaling"] = rope
        if rope_local:  # 4.x Gemma 3: the local base only, never scaled
            assert rope_local["rope_type"] == "default", "4.x has no scaling for the local RoPE"
            kw["rope_local_base_freq"] = rope_local["rope_theta"]
    if tf_major() < 5 and "layer_types" in kw and spec["config_class"] not in ("Gemma2Config", "Gemma3TextConfig"):
        kw.pop("layer_types")
    kw["attn_implementation"] = "eager"
    cfg = getattr(transformers, spec["config_class"])(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def make_model(spec, cfg):
    model = getattr(transformers, spec["arch"])(cfg)
    model.to(torch.float32)
    model.eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    return model


def init_weights(model, spec, seed):
    """Every parameter random (norm weights and biases included), scaled so the logits are O(1)."""
    g = torch.Generator().manual_seed(seed)
    touched = 0
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):  # named_parameters() lists a tied weight once
            randn = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                value = STD_NORM * randn + (0.0 if spec["norm"] == "1+w" else 1.0)
            elif name.endswith(".bias"):
                value = STD_BIAS * randn
            elif "embed_tokens" in name:
                value = STD_EMBED * randn
            elif name.startswith("lm_head"):
                value = STD_LM_HEAD * randn
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                value = STD_QK * randn
            elif name.endswith("qkv_proj.weight"):  # fused rows q, k, v: q and k as large as the separate ones
                c = spec["config"]
                qk_rows = (c["num_attention_heads"] + c["num_key_value_heads"]) * c["head_dim"]
                value = STD_LINEAR * randn
                value[:qk_rows] = STD_QK * randn[:qk_rows]
            elif name.endswith("_proj.weight"):
                value = STD_LINEAR * randn
            else:
                raise AssertionError(f"init_weights: no rule for parameter {name} {tuple(p.shape)}")
            p.copy_(value)
            touched += 1
    return touched


def check_tying(model, tied):
    same = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert same == tied, f"tie_word_embeddings={tied} but lm_head shares embed_tokens storage: {same}"


def check_norm_style(model, style):
    """Measures whether the final norm computes x_hat * w or x_hat * (1 + w)."""
    norm = model.model.norm
    x = torch.randn(3, norm.weight.shape[0], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = norm(x)
        x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm_eps(model))
        err_w, err_1w = rel_err(y, x_hat * norm.weight), rel_err(y, x_hat * (1 + norm.weight))
    measured = "w" if err_w < err_1w else "1+w"
    assert measured == style and min(err_w, err_1w) < 1e-5, \
        f"norm style: expected {style}, errors w={err_w:.3g} 1+w={err_1w:.3g}"


def norm_eps(model):
    return float(model.config.rms_norm_eps)


def check_gelu_tanh(model):
    act = model.model.layers[0].mlp.act_fn
    x = torch.linspace(-4, 4, 101)
    with torch.no_grad():
        tanh_ref = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        erf_ref = torch.nn.functional.gelu(x)
        y = act(x)
    assert (y - tanh_ref).abs().max() < 1e-5 and (y - erf_ref).abs().max() > 1e-4, \
        f"activation {act} is not gelu with the tanh approximation"


def check_rope_per_type(model, spec):
    """Gemma 3: each table (global, local) must be some inv_freq buffer of the model (4.x: rotary_emb and
    rotary_emb_local; 5.x: <layer_type>_inv_freq), the two must differ, and both must match their formulas."""
    bufs = [(n, b.detach().double()) for n, b in model.named_buffers() if n.endswith("inv_freq")]
    assert len(bufs) >= 2, f"expected two inv_freq buffers, got {[n for n, _ in bufs]}"
    worst = 0.0
    for which in ("rope", "rope_local"):
        want = torch.tensor(expected_inv_freq(spec, spec[which])[0], dtype=torch.float64)
        errs = {n: float(((b - want).abs() / want).max()) for n, b in bufs if b.shape == want.shape}
        name, err = min(errs.items(), key=lambda kv: kv[1])
        assert err < 1e-5, f"{which}: no inv_freq buffer matches the independent formula (best {name}: {err:.3g})"
        log(f"  {which} inv_freq matches {name} (max rel {err:.2g})")
        worst = max(worst, err)
    return worst


def check_rope(model, spec):
    if spec.get("rope_local"):
        return check_rope_per_type(model, spec)
    bufs = [(n, b) for n, b in model.named_buffers() if n.split(".")[-1] == "inv_freq"]
    bufs = bufs or [(n, b) for n, b in model.named_buffers() if n.endswith("inv_freq")]
    assert bufs, "no inv_freq buffer found in the model"
    got = bufs[0][1].detach().double()
    want, regimes = expected_inv_freq(spec)
    want = torch.tensor(want, dtype=torch.float64)
    assert got.shape == want.shape, f"inv_freq shape {tuple(got.shape)} != {tuple(want.shape)} ({bufs[0][0]})"
    err = float(((got - want).abs() / want).max())
    assert err < 1e-5, f"inv_freq differs from the independent formula by {err:.3g} (rel): {got} vs {want}"
    if regimes:
        counts = {r: regimes.count(r) for r in ("high", "mid", "low")}
        assert all(counts.values()), f"llama3 regimes must all occur: {counts}"
        log(f"  llama3 inv_freq matches the independent formula (max rel {err:.2g}); regimes {counts}")
    return err


def check_longrope_choice(model, spec):
    """After a forward of SEQ positions: transformers holds the long factors' table iff SEQ > the original length."""
    c, rope = spec["config"], spec["rope"]
    dim = int(c["head_dim"] * c.get("partial_rotary_factor", 1.0))
    use_long = SEQ > c["original_max_position_embeddings"]
    ext = rope["long_factor"] if use_long else rope["short_factor"]
    want = torch.tensor([rope["rope_theta"] ** (-(2.0 * i) / dim) / e for i, e in enumerate(ext)], dtype=torch.float64)
    bufs = [(n, b.detach().double()) for n, b in model.named_buffers() if n.split(".")[-1] == "inv_freq"]
    err = min(float(((b - want).abs() / want).max()) for _, b in bufs if b.shape == want.shape)
    assert err < 1e-5, f"after the forward the inv_freq is not the {'long' if use_long else 'short'} table ({err:.3g})"
    scaling = [float(m.attention_scaling) for m in model.modules() if hasattr(m, "attention_scaling")]
    log(f"  longrope: {'long' if use_long else 'short'} factors in use (rel {err:.2g}), attention scaling {scaling}")


def run_model(model, ids, labels=None, capture=False):
    """Forward in f32; returns (logits, loss, {debug tensors})."""
    captured, hooks = {}, []
    if capture:
        def hook(key):
            def fn(_mod, _inp, out):
                captured[key] = (out[0] if isinstance(out, tuple) else out).detach().float().clone()
            return fn
        for i, layer in enumerate(model.model.layers):
            hooks.append(layer.register_forward_hook(hook(f"layer_out.{i}")))
        hooks.append(model.model.norm.register_forward_hook(hook("final_norm_out")))
    try:
        out = model(input_ids=ids, labels=labels, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits, out.loss, captured


def independent_loss(logits, labels):
    """Mean cross-entropy over positions whose next-token label is not -100 (transformers' shift)."""
    v = logits.shape[-1]
    lg = logits[:, :-1].reshape(-1, v).double()
    lb = labels[:, 1:].reshape(-1)
    keep = lb != -100
    lse = torch.logsumexp(lg[keep], dim=-1)
    return float((lse - lg[keep].gather(1, lb[keep].unsqueeze(1)).squeeze(1)).mean())


def check_window(spec, seed, ids):
    """One sliding layer: changing token 0 must change exactly the outputs that can see it."""
    w = spec["window"]
    ov = {"config": {"num_hidden_layers": 1}}
    if w["layer_types"] is not None:
        ov["config"]["layer_types"] = w["layer_types"]
    m = make_model(spec, build_config(spec, ov))
    init_weights(m, spec, seed)
    other = ids.clone()
    other[:, 0] = (other[:, 0] + 1) % spec["config"]["vocab_size"]
    with torch.no_grad():
        a, _, _ = run_model(m, ids)
        b, _, _ = run_model(m, other)
    changed = [t for t in range(ids.shape[1]) if float((a[:, t] - b[:, t]).abs().max()) > 1e-6]
    expected = list(range(w["size"]))
    status = "OK" if changed == expected else "WARNING: not the expected semantics"
    log(f"  window check: token 0 influences positions {changed} (expected {expected}: "
        f"query q sees keys q-{w['size'] - 1}..q) {status}")
    return changed


def save_tensors(path, tensors, metadata=None):
    out = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    safetensors_torch.save_file(out, str(path), metadata={k: str(v) for k, v in (metadata or {}).items()})


def save_model(model, spec, model_dir):
    params = inspect.signature(model.save_pretrained).parameters
    kw = {}
    if "safe_serialization" in params:
        kw["safe_serialization"] = True
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    if spec["save_dtype"] == "bfloat16":
        # A copy: .to() would also round the live model's float buffers (rope inv_freq) through bf16.
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(str(model_dir), **kw)
    else:
        model.save_pretrained(str(model_dir), **kw)
    files = sorted(p.name for p in model_dir.iterdir() if p.name.startswith(("model", "config", "generation_config")))
    if spec["shard"]:
        shards = [f for f in files if f.startswith("model-") and f.endswith(".safetensors")]
        assert "model.safetensors.index.json" in files and len(shards) >= 2, f"expected 2+ shards, got {files}"
    else:
        assert "model.safetensors" in files, f"expected model.safetensors, got {files}"
    assert "config.json" in files, files
    return files


def load_kwargs(dtype=None):
    key = "dtype" if tf_major() >= 5 else "torch_dtype"
    return {key: dtype or torch.float32, "attn_implementation": "eager"}


def lora_saved_name(param_name):
    return param_name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def call_with_supported(fn, *args, **kw):
    """Calls fn with only the keyword arguments its signature names (APIs differ between versions)."""
    params = inspect.signature(fn).parameters
    return fn(*args, **{k: v for k, v in kw.items() if k in params})


def lora_scaling(pm):
    scales = {float(m.scaling["default"]) for m in pm.modules()
              if isinstance(getattr(m, "scaling", None), dict) and "default" in m.scaling}
    assert len(scales) == 1, f"expected one LoRA scale, got {scales}"
    return scales.pop()


def make_lora(name, spec, model, base_logits, ids, labels, vdir):
    """Wraps `model` (in place) with a PEFT LoRA, saves the adapter and the LoRA reference tensors."""
    from peft import LoraConfig, PeftModel, get_peft_model

    seed = spec["seed"]
    n_layers = spec["config"]["num_hidden_layers"]
    torch.manual_seed(seed + 100)
    targets = spec.get("lora_targets", LORA_TARGETS)
    lcfg = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=list(targets),
                      use_rslora=spec["use_rslora"], bias="none", task_type="CAUSAL_LM")
    pm = get_peft_model(model, lcfg)
    pm.eval()
    lora = {n: p for n, p in pm.named_parameters() if p.requires_grad}
    assert all(".lora_A." in n or ".lora_B." in n for n in lora), sorted(lora)
    assert len(lora) == 2 * n_layers * len(targets), f"{len(lora)} trainable tensors: {sorted(lora)}"

    # A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's default bound) and B ~ 0.05 randn, from our own generator so the
    # values do not depend on the PEFT version; B != 0 makes the adapter change the logits.
    g = torch.Generator().manual_seed(seed + 200)
    with torch.no_grad():
        for n in sorted(lora):
            p = lora[n]
            if ".lora_A." in n:
                bound = 1.0 / math.sqrt(p.shape[1])
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
            else:
                p.copy_(LORA_B_STD * torch.randn(p.shape, generator=g))
    scale = lora_scaling(pm)
    want_scale = LORA_ALPHA / (math.sqrt(LORA_R) if spec["use_rslora"] else LORA_R)
    assert abs(scale - want_scale) < 1e-9, f"LoRA scale {scale} != {want_scale}"

    adapter_dir = vdir / "adapter"
    call_with_supported(pm.save_pretrained, str(adapter_dir), safe_serialization=True, save_embedding_layers=False)
    readme = adapter_dir / "README.md"
    if readme.exists():
        readme.unlink()  # PEFT's boilerplate model card; not part of the fixture
    saved = safetensors_torch.load_file(str(adapter_dir / "adapter_model.safetensors"))
    names = {lora_saved_name(n): n for n in lora}
    assert set(saved) == set(names), f"saved {sorted(saved)} vs params {sorted(names)}"
    for k, n in names.items():
        assert torch.equal(saved[k], lora[n].detach()), f"saved {k} differs from the parameter"
        assert saved[k].dtype == torch.float32, f"{k} saved as {saved[k].dtype}"
    acfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert acfg["r"] == LORA_R and acfg["lora_alpha"] == LORA_ALPHA, acfg
    assert bool(acfg.get("use_rslora", False)) == spec["use_rslora"], acfg
    assert sorted(acfg["target_modules"]) == sorted(targets), acfg["target_modules"]

    # Forward + backward with the adapter active.
    logits, loss, _ = run_model(pm, ids, labels)
    ind = independent_loss(logits.detach(), labels)
    assert abs(ind - float(loss)) < 1e-5 * max(1.0, ind), f"LoRA loss {float(loss)} vs independent {ind}"
    lora_effect = rel_err(logits, base_logits)
    assert lora_effect > 1e-3, f"the adapter barely changes the logits (rel {lora_effect:.3g})"
    loss.backward()
    grads = {}
    for k, n in names.items():
        gr = lora[n].grad
        assert gr is not None and torch.isfinite(gr).all() and float(gr.abs().max()) > 0, f"bad grad for {k}"
        grads[k] = gr.detach().clone()
    min_abs_grad = min(float(gr.abs().min()) for gr in grads.values())

    # One AdamW step over the LoRA tensors only, checked against the closed form of step 1:
    # p1 = p0 (1 - lr wd) - lr g / (|g| + eps)   (m_hat = g, v_hat = g^2 after bias correction).
    before = {k: lora[n].detach().clone() for k, n in names.items()}
    opt = torch.optim.AdamW([lora[names[k]] for k in sorted(names)], lr=ADAMW["lr"],
                            betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    opt.step()
    after = {k: lora[n].detach().clone() for k, n in names.items()}
    for k in names:
        p0, gr = before[k].double(), grads[k].double()
        want = p0 * (1 - ADAMW["lr"] * ADAMW["weight_decay"]) - ADAMW["lr"] * gr / (gr.abs() + ADAMW["eps"])
        err = (after[k].double() - want).abs() - (5e-8 + 1e-6 * p0.abs())
        assert float(err.max()) <= 0, f"AdamW step for {k} differs from the closed form"

    # Reload the saved base model + adapter from disk, check they reproduce the LoRA logits, then merge.
    base2 = transformers.AutoModelForCausalLM.from_pretrained(str(vdir), **load_kwargs()).eval()
    pm2 = PeftModel.from_pretrained(base2, str(adapter_dir)).eval()
    with torch.no_grad():
        reload_err = rel_err(run_model(pm2, ids)[0], logits)
        assert reload_err < 1e-5, f"reloaded base+adapter logits differ from the live ones by {reload_err:.3g}"
        merged = pm2.merge_and_unload().eval()
        assert not any("lora" in n for n, _ in merged.named_parameters()), "merge_and_unload left LoRA tensors"
        merged_logits = run_model(merged, ids)[0]
    merge_err = rel_err(merged_logits, logits)
    assert merge_err < 1e-4, f"merged logits differ from the LoRA logits by {merge_err:.3g}"

    # The same base + adapter in bf16 (PEFT keeps the adapter in f32): the mixed precision Loom's
    # bf16 mode uses. Loom's bf16 results are judged by how far PyTorch's own bf16 run lands from f32.
    base_bf = transformers.AutoModelForCausalLM.from_pretrained(str(vdir), **load_kwargs(torch.bfloat16)).eval()
    with torch.no_grad():
        base_bf_logits = run_model(base_bf, ids)[0].float()
    pm_bf = PeftModel.from_pretrained(base_bf, str(adapter_dir), is_trainable=True)
    pm_bf.eval()
    bf_params = dict(pm_bf.named_parameters())
    bf_logits, bf_loss, _ = run_model(pm_bf, ids, labels)
    bf_loss.backward()
    bf = {"base_logits": base_bf_logits, "logits": bf_logits.detach().float(),
          "loss": bf_loss.detach().float().reshape(1)}
    for k, n in names.items():
        assert bf_params[n].dtype == torch.float32, f"PEFT kept {n} in {bf_params[n].dtype}"
        bf[f"grad.{k}"] = bf_params[n].grad.detach().float()
    save_tensors(vdir / "reference_lora_bf16.safetensors", bf,
                 {"what": "base model in bfloat16, LoRA adapter in float32 (PEFT autocast), CPU, eager attention"})
    log(f"  bf16: base logits rel {rel_err(base_bf_logits, base_logits):.3g}, lora logits rel "
        f"{rel_err(bf_logits, logits):.3g}, worst grad rel "
        f"{max(rel_err(bf['grad.' + k], grads[k]) for k in names):.3g}")

    tensors = {"logits": logits.detach().float(), "loss": loss.detach().float().reshape(1),
               "merged_logits": merged_logits.detach().float()}
    tensors.update({f"grad.{k}": v.float() for k, v in grads.items()})
    tensors.update({f"after_step.{k}": v.float() for k, v in after.items()})
    meta = {"optimizer": "torch.optim.AdamW", "lr": ADAMW["lr"], "beta1": ADAMW["beta1"], "beta2": ADAMW["beta2"],
            "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"], "amsgrad": False, "optimizer_steps": 1,
            "lora_r": LORA_R, "lora_alpha": LORA_ALPHA, "use_rslora": spec["use_rslora"], "lora_scale": scale,
            "lora_dropout": 0.0, "target_modules": ",".join(targets),
            "grad_of": "loss (mean CE over labels != -100 after the shift)",
            "merged_logits": "peft merge_and_unload of base + adapter/ (weights before the AdamW step), f32"}
    save_tensors(vdir / "reference_lora.safetensors", tensors, meta)
    log(f"  lora: scale {scale:.4g}, loss {float(loss):.5f}, |lora-base|/|base| {lora_effect:.3g}, "
        f"reload {reload_err:.2g}, merged {merge_err:.2g}, min |grad| {min_abs_grad:.2g}")
    return {"scale": scale, "use_rslora": spec["use_rslora"], "tensors": len(names), "loss": float(loss),
            "lora_vs_base_rel": lora_effect, "merged_vs_lora_rel": merge_err, "reload_rel": reload_err,
            "min_abs_grad": min_abs_grad}


def make_variant(name, spec, out_dir, do_lora):
    t0 = time.time()
    vdir = out_dir / name
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir(parents=True)
    seed = spec["seed"]
    log(f"== {name}: {spec['arch']} (seed {seed}) -> {vdir}")
    torch.manual_seed(seed)
    model = make_model(spec, build_config(spec))
    n_params = init_weights(model, spec, seed)
    if spec["save_dtype"] == "bfloat16":
        with torch.no_grad():  # the reference is computed from exactly the weights the bf16 file holds
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    check_tying(model, spec["config"]["tie_word_embeddings"])
    check_norm_style(model, spec["norm"])
    if spec["config"].get("hidden_act") == "gelu_pytorch_tanh":
        check_gelu_tanh(model)
    check_rope(model, spec)
    layer_types = getattr(model.config, "layer_types", None)
    if spec["arch"] in ("Gemma2ForCausalLM", "Gemma3ForCausalLM") and layer_types is not None:
        assert list(layer_types) == ["sliding_attention", "full_attention"], layer_types
    log(f"  {n_params} parameter tensors initialised; layer_types={layer_types}")

    g = torch.Generator().manual_seed(1000 + seed)
    ids = torch.randint(0, spec["config"]["vocab_size"], (BATCH, SEQ), generator=g)
    labels = ids.clone()
    for b, positions in IGNORED_LABELS.items():
        labels[b, positions] = -100
    save_tensors(vdir / "inputs.safetensors", {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32)},
                 {"ignore_index": -100, "loss": "mean CE of logits[:, t] vs labels[:, t+1] over labels != -100"})

    with torch.no_grad():
        logits, loss, debug = run_model(model, ids, labels, capture=True)
    ind = independent_loss(logits, labels)
    assert abs(ind - float(loss)) < 1e-5 * max(1.0, ind), f"loss {float(loss)} vs independent {ind}"
    std = float(logits.std())
    assert 0.2 < std < 10, f"logits std {std:.3g} is far from O(1); adjust the init scales"
    if not 0.5 < std < 4:
        log(f"  WARNING: logits std {std:.3g} outside [0.5, 4]")
    if spec["rope"]["rope_type"] == "longrope":
        check_longrope_choice(model, spec)
    tensors = {"logits": logits.float(), "loss": loss.float().reshape(1)}
    tensors.update(debug)
    save_tensors(vdir / "reference.safetensors", tensors,
                 {"dtype": "float32", "attn_implementation": "eager", "device": "cpu",
                  "layer_out.i": "output of model.model.layers[i] (residual stream), debug only",
                  "final_norm_out": "output of model.model.norm, debug only"})
    log(f"  logits std {std:.3f}, loss {float(loss):.5f} (independent {ind:.5f})")

    ablations = {}
    for what, ov in spec["ablations"]:
        m2 = make_model(spec, build_config(spec, ov))
        m2.load_state_dict(model.state_dict())
        with torch.no_grad():
            d = rel_err(run_model(m2, ids)[0], logits)
        ablations[what] = d
        log(f"  ablation '{what}': logits change by {d:.3g} (rel L2)" + ("  WARNING: small" if d < 1e-2 else ""))
        assert d > 1e-4, f"{name}: '{what}' does not change the logits; the fixture would not test it"
    window = check_window(spec, seed, ids) if spec.get("window") else None

    files = save_model(model, spec, vdir)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(vdir), **load_kwargs()).eval()
    with torch.no_grad():
        reload_err = rel_err(run_model(reloaded, ids)[0], logits)
    assert reload_err < 1e-6, f"reloaded checkpoint logits differ by {reload_err:.3g}"
    log(f"  saved {files}; reload rel err {reload_err:.2g}")
    del reloaded

    summary = {"arch": spec["arch"], "seed": seed, "config": spec["config"],
               "rope_parameters": ({"full_attention": spec["rope"], "sliding_attention": spec["rope_local"]}
                                   if spec.get("rope_local") else spec["rope"]),
               "norm": spec["norm"], "save_dtype": spec["save_dtype"], "sharded": bool(spec["shard"]),
               "layer_types": list(layer_types) if layer_types else None, "model_files": files,
               "logits_std": std, "loss": float(loss), "ablations_rel": ablations,
               "window_influenced_positions": window}
    if do_lora:
        summary["lora"] = make_lora(name, spec, model, logits, ids, labels, vdir)
    summary["bytes"] = sum(p.stat().st_size for p in vdir.rglob("*") if p.is_file())
    log(f"  done in {time.time() - t0:.1f} s, {summary['bytes'] / 1e6:.2f} MB")
    return summary


def resolve_names(only, variants=None):
    """--only's names (repeatable or comma-separated) checked against `variants` (default: VARIANTS)."""
    variants = VARIANTS if variants is None else variants
    if not only:
        return list(variants)
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {list(variants)}")
    return names


def run_variants(names, make_one, out_dir, manifest_path, args):
    """make_one(name) for each variant, its result recorded under the manifest's "variants" (the manifest
    at manifest_path is extended with --only); a variant that raises is logged, left out and, unless
    --keep-failed, its folder removed (never half-written fixtures to commit); --stop-on-error stops
    there. Shared by make_moe_reference.py. -> (manifest, failed names)"""
    manifest = {"variants": {}}
    if args.only and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
    failed = []
    for name in names:
        try:
            manifest["variants"][name] = make_one(name)
        except Exception:
            import traceback
            traceback.print_exc()
            log(f"!! variant {name} FAILED")
            failed.append(name)
            manifest["variants"].pop(name, None)
            if not args.keep_failed:
                shutil.rmtree(out_dir / name, ignore_errors=True)
            if args.stop_on_error:
                break
    return manifest, failed


def exit_code(names, failed):
    """Logs the outcome of run_variants: 1 when a variant failed, else 0."""
    if failed:
        log(f"FAILED variants: {failed}")
        return 1
    log(f"all {len(names)} variant(s) OK")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__ or "Make Loom's model reference fixtures.")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default tests/fixtures/models)")
    ap.add_argument("--only", action="append", help="variant(s) to make, repeatable or comma-separated")
    ap.add_argument("--dry-run", action="store_true", help="print the planned configs; needs no torch")
    ap.add_argument("--no-lora", action="store_true", help="skip the adapter and reference_lora (debugging)")
    ap.add_argument("--stop-on-error", action="store_true", help="stop at the first failing variant")
    ap.add_argument("--keep-failed", action="store_true", help="keep the folder of a failed variant (debugging)")
    ap.add_argument("--threads", type=int, default=4, help="torch CPU threads")
    args = ap.parse_args()
    names = resolve_names(args.only)
    if args.dry_run:
        print_plan(names)
        return 0

    global torch, transformers, peft, safetensors_torch
    import peft  # noqa: F401
    import safetensors
    import safetensors.torch as safetensors_torch
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                "safetensors": safetensors.__version__, "python": sys.version.split()[0]}
    log(f"versions: {versions}")
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    manifest_path = out_dir / "manifest.json"
    manifest, failed = run_variants(
        names, lambda name: make_variant(name, copy.deepcopy(VARIANTS[name]), out_dir, not args.no_lora), out_dir,
        manifest_path, args)
    manifest.update({
        "generated_by": "tools/reference/make_reference.py", "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "versions": versions, "batch": BATCH, "seq": SEQ, "ignored_label_positions": IGNORED_LABELS,
        "lora": {"r": LORA_R, "alpha": LORA_ALPHA, "dropout": 0.0, "targets": LORA_TARGETS, "b_std": LORA_B_STD},
        "adamw": ADAMW,
        "init_std": {"embed": STD_EMBED, "lm_head": STD_LM_HEAD, "linear": STD_LINEAR, "q_k_proj": STD_QK,
                     "norm": STD_NORM, "bias": STD_BIAS},
    })
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    log(f"wrote {manifest_path}; {out_dir} holds {total / 1e6:.2f} MB" + ("  WARNING: > 8 MB" if total > 8e6 else ""))
    return exit_code(names, failed)


if __name__ == "__main__":
    sys.exit(main())
