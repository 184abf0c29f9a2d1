"""The format facts tools/reference/make_moe_reference.py asserts (tools/reference/moe_formats.md): what a variant's spec
implies (expert counts, widths, sparse layers, checkpoint keys, expert LoRA shapes), a forward that
captures the MoE layers' routing (Run), and the checks of transformers' and PEFT's MoE layout, routing,
load-balancing loss and expert LoRA (ParamWrapper layout, merge) against f64 re-implementations, and
check_bnb (what transformers + bitsandbytes 4-bit does to these models, observed). torch, transformers, peft and safetensors.torch are bound by make_moe_reference.main()."""
from __future__ import annotations

import copy
import inspect
import math
import re
import tempfile
from pathlib import Path

import make_reference as mr

torch = transformers = peft = safetensors_torch = None
log, rel_err = mr.log, mr.rel_err
LORA_R, LORA_ALPHA, LORA_B_STD = mr.LORA_R, mr.LORA_ALPHA, mr.LORA_B_STD
MARGIN_MIN = 1e-4              # smallest allowed gap between consecutive top-(K+1) router probabilities (f32)
ATTN_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERT_TARGETS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# Hub checkpoint names of the experts: (block prefix, gate, up, down).
CKPT_NAMES = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2"), "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj")}


def n_experts(spec):
    c = spec["config"]
    return c["num_local_experts"] if spec["family"] == "mixtral" else c["num_experts"]


def expert_width(spec):
    c = spec["config"]
    return c["intermediate_size"] if spec["family"] == "mixtral" else c["moe_intermediate_size"]


def top_k(spec):
    return spec["config"]["num_experts_per_tok"]


def head_dim(spec):
    c = spec["config"]
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def expected_sparse_layers(spec):
    """transformers' rule (tools/reference/moe_formats.md (a)): Mixtral every layer; Qwen3-MoE layer l iff l is not in
    mlp_only_layers and (l + 1) % decoder_sparse_step == 0."""
    c = spec["config"]
    n = c["num_hidden_layers"]
    if spec["family"] == "mixtral":
        return list(range(n))
    only = c.get("mlp_only_layers") or []
    return [l for l in range(n) if l not in only and c["num_experts"] > 0 and (l + 1) % c["decoder_sparse_step"] == 0]


def expected_checkpoint_keys(spec):
    """Every key model.save_pretrained must write (per-expert hub names)."""
    c = spec["config"]
    block, wg, wu, wd = CKPT_NAMES[spec["family"]]
    keys = {"model.embed_tokens.weight", "model.norm.weight"}
    if not c["tie_word_embeddings"]:
        keys.add("lm_head.weight")
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        keys |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        keys |= {p + f"self_attn.{x}_proj.weight" for x in "qkvo"}
        if spec["family"] == "qwen3_moe":
            keys |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
        if l in spec["sparse_layers"]:
            keys.add(f"{p}{block}.gate.weight")
            keys |= {f"{p}{block}.experts.{e}.{w}.weight" for e in range(n_experts(spec)) for w in (wg, wu, wd)}
        else:
            keys |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    return keys


def expected_expert_lora_shapes(spec):
    """{target parameter: (lora_A shape, lora_B shape)} of PEFT's ParamWrapper (tools/reference/moe_formats.md (c))."""
    e, i, h, r = n_experts(spec), expert_width(spec), spec["config"]["hidden_size"], LORA_R
    return {"gate_up_proj": ((r * e, h), (2 * i, r * e)), "down_proj": ((r * e, i), (h, r * e))}


def n_lora_tensors(spec):
    return 2 * (len(ATTN_TARGETS) * spec["config"]["num_hidden_layers"] + len(EXPERT_TARGETS) * len(spec["sparse_layers"]))


# ---------------------------------------------------------------------------------------------------------------
# The checks (torch).

def layer_of(module_name):
    m = re.search(r"(?:^|\.)layers\.(\d+)\.", module_name)
    assert m, f"no layer index in module name {module_name}"
    return int(m.group(1))


def moe_modules(model):
    """{layer: router module}, {layer: sparse MoE block}, {layer: experts module}, found by class name."""
    routers, blocks, experts = {}, {}, {}
    for name, m in model.named_modules():
        cls = type(m).__name__
        if cls.endswith("TopKRouter"):
            routers[layer_of(name + ".")] = m
        elif cls.endswith("SparseMoeBlock"):
            blocks[layer_of(name + ".")] = m
        elif cls.endswith("Experts") and hasattr(m, "gate_up_proj"):
            experts[layer_of(name + ".")] = m
    return routers, blocks, experts


def check_structure(model, spec):
    c = spec["config"]
    routers, blocks, experts = moe_modules(model)
    sparse = spec["sparse_layers"]
    assert sorted(routers) == sorted(blocks) == sorted(experts) == sparse, \
        f"MoE layers: routers {sorted(routers)}, blocks {sorted(blocks)}, experts {sorted(experts)}; want {sparse}"
    e, i, h = n_experts(spec), expert_width(spec), c["hidden_size"]
    for l in sparse:
        assert tuple(routers[l].weight.shape) == (e, h), f"router {l}: {tuple(routers[l].weight.shape)}"
        assert tuple(experts[l].gate_up_proj.shape) == (e, 2 * i, h), f"gate_up_proj {tuple(experts[l].gate_up_proj.shape)}"
        assert tuple(experts[l].down_proj.shape) == (e, h, i), f"down_proj {tuple(experts[l].down_proj.shape)}"
        assert not getattr(experts[l], "is_transposed", False), "experts stored transposed"
        assert isinstance(routers[l], torch.nn.Module) and not isinstance(routers[l], torch.nn.Linear)
    layers = model.model.layers
    for l in range(c["num_hidden_layers"]):
        if l not in sparse:
            mlp = layers[l].mlp
            assert tuple(mlp.gate_proj.weight.shape) == (c["intermediate_size"], h), f"dense mlp {l}"
    assert c.get("hidden_act", "silu") == "silu" and model.config.hidden_act == "silu", model.config.hidden_act


class Run:
    """One forward: logits, loss, aux_loss, router_logits (tuple or None), captured tensors."""

    def __init__(self, model, ids, labels=None, attention_mask=None, router=False, capture=False):
        self.cap = {}
        hooks = []
        if capture:
            routers, blocks, _ = moe_modules(model)

            def router_hook(l):
                def fn(_m, inp, out):
                    self.cap[f"router_in.{l}"] = inp[0].detach().float().clone()
                    self.cap[f"router_logits.{l}"] = out[0].detach().float().clone()
                    self.cap[f"router_weights.{l}"] = out[1].detach().float().clone()
                    self.cap[f"router_weights_dtype.{l}"] = out[1].dtype
                    self.cap[f"router_ids.{l}"] = out[2].detach().clone()
                return fn

            def block_hook(l):
                def fn(_m, inp, out):
                    self.cap[f"moe_in.{l}"] = inp[0].detach().float().clone()
                    self.cap[f"moe_out.{l}"] = (out[0] if isinstance(out, tuple) else out).detach().float().clone()
                return fn

            def out_hook(key):
                def fn(_m, _inp, out):
                    self.cap[key] = (out[0] if isinstance(out, tuple) else out).detach().float().clone()
                return fn

            for l, m in routers.items():
                hooks.append(m.register_forward_hook(router_hook(l)))
            for l, m in blocks.items():
                hooks.append(m.register_forward_hook(block_hook(l)))
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            for i, layer in enumerate(base.model.layers):
                hooks.append(layer.register_forward_hook(out_hook(f"layer_out.{i}")))
            hooks.append(base.model.norm.register_forward_hook(out_hook("final_norm_out")))
        kw = {"input_ids": ids, "use_cache": False, "output_router_logits": bool(router)}
        if labels is not None:
            kw["labels"] = labels
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        try:
            out = model(**kw)
        finally:
            for h in hooks:
                h.remove()
        self.logits, self.loss = out.logits, out.loss
        self.aux_loss = getattr(out, "aux_loss", None)
        self.router_logits = getattr(out, "router_logits", None)


def route_f64(logits, k, renorm):
    """Independent router: softmax in f64, top k, optional renormalisation; also the smallest gap between the
    sorted probabilities 1..K+1."""
    p = torch.softmax(logits.double(), dim=-1)
    top, ids = torch.topk(p, k, dim=-1)
    if renorm:
        top = top / top.sum(-1, keepdim=True)
    # The smallest gap between consecutive probabilities among the first K + 1: the chosen set and its order
    # are then unambiguous.
    srt = torch.sort(p, dim=-1, descending=True).values
    last = min(k, p.shape[-1] - 1)
    margin = float((srt[:, :last] - srt[:, 1:last + 1]).min()) if last > 0 else math.inf
    return top, ids, margin


def aux_f64(logits_per_layer, e, k, mask=None):
    """transformers' load_balancing_loss_func (tools/reference/moe_formats.md (b)) in f64, independently written."""
    count = torch.zeros(e, dtype=torch.float64)
    psum = torch.zeros(e, dtype=torch.float64)
    rows = 0.0
    for lg in logits_per_layer:
        p = torch.softmax(lg.double(), dim=-1)
        sel = torch.topk(p, k, dim=-1).indices
        m = torch.ones(p.shape[0], dtype=torch.float64) if mask is None else mask.reshape(-1).double()
        for j in range(k):
            count.index_add_(0, sel[:, j], m)
        psum += (p * m[:, None]).sum(0)
        rows += float(m.sum())
    return float(e * ((count / rows) * (psum / rows)).sum())


def check_routing(run, model, spec):
    """Router logits = x W^T, the f64 top-K equals the router's, weights equal; returns (margin, coverage ok,
    per-layer summary). Raises on a mismatch that is not a near-tie."""
    routers, _, _ = moe_modules(model)
    e, k = n_experts(spec), top_k(spec)
    margin, covered, summary = math.inf, True, {}
    for l in spec["sparse_layers"]:
        x, lg = run.cap[f"router_in.{l}"], run.cap[f"router_logits.{l}"]
        w = routers[l].weight.detach().float()
        err = rel_err(lg, x.reshape(-1, x.shape[-1]) @ w.T)
        assert err < 1e-5, f"layer {l}: router logits are not x @ W^T (rel {err:.3g})"
        top, ids, m = route_f64(lg, k, spec["renorm"])
        margin = min(margin, m)
        used = torch.bincount(run.cap[f"router_ids.{l}"].reshape(-1), minlength=e)
        covered = covered and bool((used > 0).all())
        summary[l] = {"min_margin": m, "tokens_per_expert": used.tolist()}
        if m < MARGIN_MIN:
            continue  # the caller re-seeds; a near-tie may legitimately pick differently
        assert torch.equal(run.cap[f"router_ids.{l}"].long(), ids), \
            f"layer {l}: router's top-{k} {run.cap[f'router_ids.{l}'].tolist()} != f64 {ids.tolist()}"
        werr = rel_err(run.cap[f"router_weights.{l}"], top)
        assert werr < 1e-6, f"layer {l}: routing weights differ from softmax/top-k{'/renorm' if spec['renorm'] else ''} " \
                            f"in f64 by {werr:.3g} (renormalisation assumption wrong?)"
    return margin, covered, summary


def check_moe_blocks(run, model, spec):
    """The sparse block's output equals a per-token f64 loop: sum_j w_j down_e(silu(gate_e x) * up_e x), with
    gate_e = gate_up_proj[e, :I] (gate rows first) and up_e = gate_up_proj[e, I:]."""
    _, _, experts = moe_modules(model)
    i = expert_width(spec)
    worst = 0.0
    for l in spec["sparse_layers"]:
        gu = experts[l].gate_up_proj.detach().double()
        dn = experts[l].down_proj.detach().double()
        x = run.cap[f"moe_in.{l}"].double().reshape(-1, gu.shape[-1])
        ids, w = run.cap[f"router_ids.{l}"], run.cap[f"router_weights.{l}"].double()
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                ex = int(ids[t, j])
                g, u = gu[ex, :i] @ x[t], gu[ex, i:] @ x[t]
                y[t] += w[t, j] * (dn[ex] @ (torch.nn.functional.silu(g) * u))
        err = rel_err(run.cap[f"moe_out.{l}"].reshape(y.shape), y)
        swapped = torch.zeros_like(x)  # the same with gate and up swapped: must be clearly worse
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                ex = int(ids[t, j])
                g, u = gu[ex, i:] @ x[t], gu[ex, :i] @ x[t]
                swapped[t] += w[t, j] * (dn[ex] @ (torch.nn.functional.silu(g) * u))
        err_sw = rel_err(run.cap[f"moe_out.{l}"].reshape(y.shape), swapped)
        assert err < 1e-5 and err_sw > 1e-2, \
            f"layer {l}: MoE block vs f64 loop rel {err:.3g} (gate first), {err_sw:.3g} (up first)"
        worst = max(worst, err)
    return worst


def check_checkpoint(vdir, model, spec):
    """model.safetensors holds exactly the per-expert hub names, with the in-memory values."""
    sd = safetensors_torch.load_file(str(vdir / "model.safetensors"))
    want = expected_checkpoint_keys(spec)
    got = set(sd)
    assert got == want, (f"checkpoint keys differ from the per-expert hub names: missing {sorted(want - got)[:8]}, "
                         f"unexpected {sorted(got - want)[:8]} (fused experts saved?)")
    block, wg, wu, wd = CKPT_NAMES[spec["family"]]
    routers, _, experts = moe_modules(model)
    i = expert_width(spec)
    for l in spec["sparse_layers"]:
        p = f"model.layers.{l}.{block}."
        assert torch.equal(sd[p + "gate.weight"], routers[l].weight.detach()), f"{p}gate.weight differs"
        gu, dn = experts[l].gate_up_proj.detach(), experts[l].down_proj.detach()
        for e in range(n_experts(spec)):
            assert torch.equal(sd[f"{p}experts.{e}.{wg}.weight"], gu[e, :i]), f"{p}experts.{e}.{wg} != gate_up_proj[{e}, :I]"
            assert torch.equal(sd[f"{p}experts.{e}.{wu}.weight"], gu[e, i:]), f"{p}experts.{e}.{wu} != gate_up_proj[{e}, I:]"
            assert torch.equal(sd[f"{p}experts.{e}.{wd}.weight"], dn[e]), f"{p}experts.{e}.{wd} != down_proj[{e}]"
    for k, v in sd.items():
        assert v.dtype == torch.float32, f"{k} saved as {v.dtype}"
    return sorted(k for k in got if ".experts.0." in k or k.endswith(".gate.weight"))[:8]


def load_saved(vdir, dtype=None, experts_impl="eager"):
    kw = mr.load_kwargs(dtype)
    kw["experts_implementation"] = experts_impl
    return transformers.AutoModelForCausalLM.from_pretrained(str(vdir), **kw).eval()


def check_fused_round_trip(model, ids, logits):
    """save_pretrained(save_original_format=False) writes the fused names, and from_pretrained reads them."""
    if "save_original_format" not in inspect.signature(model.save_pretrained).parameters:
        return {"supported": False}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, save_original_format=False)
        keys = set(safetensors_torch.load_file(str(Path(tmp) / "model.safetensors")))
        fused = sorted(k for k in keys if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")))
        assert fused and not any(".experts.0." in k for k in keys), f"save_original_format=False wrote {sorted(keys)[:8]}"
        m = load_saved(tmp)
        with torch.no_grad():
            err = rel_err(Run(m, ids).logits, logits)
    assert err < 1e-6, f"the fused checkpoint reloads to logits off by {err:.3g}"
    return {"supported": True, "keys": fused[:2], "reload_rel": err}


# ---------------------------------------------------------------------------------------------------------------
# LoRA

def param_wrappers(pm, lora):
    """The lora.ParamWrapper modules: [(module, info dict)] with the saved A/B names of each."""
    out = []
    for mname, m in pm.named_modules():
        if type(m).__name__ != "ParamWrapper":
            continue
        a, b = f"{mname}.lora_A.default.weight", f"{mname}.lora_B.default.weight"
        assert a in lora and b in lora, f"ParamWrapper {mname}: no trainable {a} / {b}"
        out.append((m, {"module": mname, "parameter": m.parameter_name, "layer": layer_of(mname + "."),
                        "num_experts": int(m.num_experts), "lora_A": mr.lora_saved_name(a),
                        "lora_B": mr.lora_saved_name(b), "A_param": a, "B_param": b,
                        "A_shape": list(lora[a].shape), "B_shape": list(lora[b].shape)}))
    return out


def check_wrappers(wrappers, spec):
    shapes = expected_expert_lora_shapes(spec)
    seen = {}
    for _m, w in wrappers:
        assert w["num_experts"] == n_experts(spec), f"{w['module']}: num_experts {w['num_experts']}"
        want_a, want_b = shapes[w["parameter"]]
        assert tuple(w["A_shape"]) == want_a and tuple(w["B_shape"]) == want_b, \
            f"{w['module']} ({w['parameter']}): A {w['A_shape']} B {w['B_shape']}, want A {list(want_a)} B {list(want_b)}"
        # gate_up_proj is wrapped first (inner, reached through .base_layer), down_proj second (outer).
        want_suffix = ".mlp.experts.base_layer" if w["parameter"] == "gate_up_proj" else ".mlp.experts"
        assert w["module"].endswith(want_suffix), \
            f"{w['parameter']} is wrapped at {w['module']}, expected a name ending {want_suffix} (nesting order changed)"
        seen.setdefault(w["layer"], []).append(w["parameter"])
    assert sorted(seen) == spec["sparse_layers"] and all(sorted(v) == ["down_proj", "gate_up_proj"] for v in seen.values()), \
        f"expert LoRA wrappers per layer: {seen}"


def expert_delta_f64(a, b, e, r, scale):
    """The documented layout: delta[e] = scale * B[:, e::E] @ A[e r:(e+1) r]."""
    a, b = a.double(), b.double()
    return torch.stack([scale * b[:, x::e] @ a[x * r:(x + 1) * r] for x in range(e)])


def init_lora(lora, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in sorted(lora):
            p = lora[n]
            if ".lora_A." in n:
                bound = 1.0 / math.sqrt(p.shape[1])
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
            else:
                p.copy_(LORA_B_STD * torch.randn(p.shape, generator=g))


def manual_merge(base, pm, lora, wrappers, spec, scale):
    """A copy of `base` with every LoRA delta added by the documented formulas (not PEFT's merge)."""
    merged = copy.deepcopy(base)
    mods = dict(merged.named_modules())
    e, r = n_experts(spec), LORA_R
    with torch.no_grad():
        for n, p in lora.items():
            if ".lora_A." not in n or ".mlp.experts" in n:
                continue
            owner = n.split(".lora_A.")[0].removeprefix("base_model.model.")
            bparam = lora[n.replace(".lora_A.", ".lora_B.")]
            mods[owner].weight += scale * (bparam.detach() @ p.detach())
        for _m, w in wrappers:
            _, _, experts = moe_modules(merged)
            target = getattr(experts[w["layer"]], w["parameter"])
            target += expert_delta_f64(lora[w["A_param"]].detach(), lora[w["B_param"]].detach(), e, r, scale).float()
    return merged


def check_bnb(spec, vdir, ids, ref_logits):
    """Observation only: which tensors transformers + bitsandbytes 4-bit quantise, and what it saves."""
    try:
        import bitsandbytes  # noqa: F401
        q = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                            bnb_4bit_compute_dtype=torch.float32)
        m = transformers.AutoModelForCausalLM.from_pretrained(
            str(vdir), quantization_config=q, dtype=torch.float32, attn_implementation="eager",
            experts_implementation="eager", device_map={"": 0}).eval()
        lin4 = sorted(n for n, mod in m.named_modules() if type(mod).__name__ == "Linear4bit")
        _, _, experts = moe_modules(m)
        routers, _, _ = moe_modules(m)
        l0 = spec["sparse_layers"][0]
        with torch.no_grad():
            err = rel_err(Run(m, ids.cuda()).logits.float().cpu(), ref_logits)
        with tempfile.TemporaryDirectory() as tmp:
            m.save_pretrained(tmp)
            files = sorted(p.name for p in Path(tmp).iterdir())
            keys = {}
            for f in files:
                if f.endswith(".safetensors"):
                    for k, v in safetensors_torch.load_file(str(Path(tmp) / f)).items():
                        keys[k] = [str(v.dtype), list(v.shape)]
        summary = {"linear4bit_modules": len(lin4), "linear4bit_example": lin4[:3],
                   "experts_gate_up_proj": [str(experts[l0].gate_up_proj.dtype), type(experts[l0].gate_up_proj).__name__],
                   "router_weight": [str(routers[l0].weight.dtype), type(routers[l0].weight).__name__],
                   "logits_rel_vs_f32": err, "saved_files": files,
                   "saved_expert_keys": {k: v for k, v in keys.items() if ".experts." in k and (".0." in k or "proj" in k)
                                         and f"layers.{l0}." in k},
                   "saved_keys_layer": {k: v for k, v in keys.items() if f"layers.{l0}.self_attn.q_proj" in k}}
        log(f"  bnb: {len(lin4)} Linear4bit modules, experts {summary['experts_gate_up_proj']}, logits rel {err:.3g}, "
            f"saved expert keys e.g. {list(summary['saved_expert_keys'])[:3]}")
        return summary
    except Exception as exc:
        log(f"  WARNING: bnb check: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}
