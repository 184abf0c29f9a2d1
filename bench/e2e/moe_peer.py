#!/usr/bin/env python3
"""The peers of the mixture-of-experts benchmark (bench/e2e/moe.sh): transformers 5.17 + PEFT 0.21 (bf16, and
QLoRA with bitsandbytes NF4) and Unsloth 2026.10.9's MoE path, LoRA r16 alpha 32 on q/k/v/o_proj and on the
experts, the router frozen, bf16 autocast, fused AdamW, gradient clipping at 1, random token ids in [0, 1200)
(the dense scoreboard's peers do the same); one JSON line per mode.

    python3 bench/e2e/moe_peer.py SHAPE MODE [MODE ...] [--model-dir DIR] [--layers N] [--batch B] [--seq S]
        [--steps N] [--warmup N] [--device cuda|cpu] [--dtype bf16|f32] [--experts IMPL]

MODE:
  probe               times one MoE block's forward + backward at the benchmark's token count with each experts
                      implementation transformers 5.17 registers ("eager" loop, "batched_mm", "grouped_mm"; the
                      hub-kernel ones "deepgemm" / "sonicmoe" only where the `kernels` package is installed) and
                      names the fastest ("best"): moe.sh passes it to the other modes with --experts.
  peft, peft-gc       transformers + PEFT, bf16 base, without / with gradient checkpointing (non-reentrant).
                      LoRA on the experts through PEFT's target_parameters (mlp.experts.gate_up_proj and
                      mlp.experts.down_proj: lora.ParamWrapper, one rank-16 A/B pair per expert and projection,
                      W + s B A merged on every forward). The base is drawn in memory (from_config, seed 0,
                      N(0, 0.02) as moe_model.py draws it) unless --model-dir is given with MOE_PEER_SOURCE=folder.
  bnb, bnb-gc         the same with BitsAndBytesConfig NF4, double quantisation, bf16 compute: the base drawn in
                      memory as peft's and its layers converted as from_pretrained converts them (transformers'
                      own skip list and module test, then bitsandbytes quantises each weight on the device), or
                      from_pretrained(DIR, quantization_config=...) with MOE_PEER_SOURCE=folder: the 48-layer
                      Qwen3 and the Mixtral folders (61 and 93 GB) do not fit the GPU machine's disk, their models
                      do fit an H200. transformers 5.17 quantises only nn.Linear modules: the 3-D experts and the
                      router stay bf16 (the line's "quantised" says what was, and its size). prepare_model_for_kbit_training is not
                      called: it casts every bf16 parameter to f32, the unquantised experts included (2x the
                      largest part of the model); MOE_BNB_PREPARE=1 calls it.
  unsloth, unsloth-nogc, unsloth-qlora, unsloth-qlora-nogc
                      Unsloth's generic loader, as its Qwen3-MoE notebooks drive it (FastModel.from_pretrained of
                      DIR, FastModel.get_peft_model with target_modules q/k/v/o/gate/up/down_proj, which it maps
                      to target_parameters on the fused experts), its "unsloth" gradient checkpointing or none;
                      its MoE backend is its own choice (UNSLOTH_MOE_BACKEND to force one; the line records it).
                      "-qlora": load_in_4bit (Unsloth quantises the experts too).

Each mode runs in a child process (an OOM cannot take the next down). tok_s is batch x seq over the median
step time past the warm-up; peak_GiB is torch.cuda.max_memory_allocated over load and training (the dense
scoreboard's measure; moe.sh adds nvidia-smi's peak for every run, Loom's too).
Env: MOE_PEER_SOURCE (init | folder; default init), MOE_PEER_EXPERT_LORA (1; 0 = LoRA on attention only),
MOE_PEER_AUTOCAST (1), BENCH_MODE_TIMEOUT_S (600), MOE_BNB_PREPARE (0), MOE_PEER_PROFILE (a path, {mode} replaced by the mode: one more step under torch.profiler, its kernels by
GPU time written there).
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_model  # noqa: E402
import unsloth_family  # noqa: E402  (its import sets the offline environment every peer needs)

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERT_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]  # both families, in memory (5.x)
MODES = ("probe", "peft", "peft-gc", "bnb", "bnb-gc", "unsloth", "unsloth-nogc", "unsloth-qlora",
         "unsloth-qlora-nogc")


def who(mode, impl):
    gc = " + gradient checkpointing"
    return {"peft": f"transformers+peft ({impl})", "peft-gc": f"transformers+peft ({impl}){gc}",
            "bnb": f"peft+bnb QLoRA ({impl})", "bnb-gc": f"peft+bnb QLoRA ({impl}){gc}",
            "unsloth": "unsloth (offload checkpointing)", "unsloth-nogc": "unsloth (no checkpointing)",
            "unsloth-qlora": "unsloth QLoRA (offload checkpointing)",
            "unsloth-qlora-nogc": "unsloth QLoRA (no checkpointing)"}.get(mode, mode)


def hf_config(a):
    from transformers import AutoConfig
    c = moe_model.config(a.shape, a.layers or None)
    c = {k: v for k, v in c.items() if k not in ("architectures", "torch_dtype")}
    return AutoConfig.for_model(c.pop("model_type"), **c)


def gib(n):
    return round(n / 2**30, 2)


def sync(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def probe(a):
    """Forward + backward of one sparse MoE block (experts and router frozen, the input needing its gradient, as
    in LoRA training) at batch x seq tokens, per experts implementation: milliseconds, or why it could not run."""
    import torch
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    cfg = hf_config(a)
    if cfg.model_type == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block
    else:
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    cfg._experts_implementation = "eager"
    block = Block(cfg).to(a.device, dtype)
    for p in block.parameters():
        p.requires_grad_(False)
        p.normal_(0.0, 0.02)
    x = torch.randn(a.batch, a.seq, cfg.hidden_size, device=a.device, dtype=dtype)
    have_kernels = importlib.util.find_spec("kernels") is not None
    ms, errors = {}, {}
    for impl in ["eager"] + sorted(ALL_EXPERTS_FUNCTIONS.keys()):
        if impl in ("deepgemm", "sonicmoe") and not have_kernels:
            errors[impl] = "needs the `kernels` package and a hub download (neither here)"
            continue
        cfg._experts_implementation = impl
        try:
            times = []
            for i in range(4):
                xi = x.detach().requires_grad_(True)
                sync(a.device)
                t = time.perf_counter()
                out = block(xi)
                out = out[0] if isinstance(out, tuple) else out
                out.float().square().mean().backward()
                sync(a.device)
                times.append(time.perf_counter() - t)
            ms[impl] = round(1000 * sorted(times[1:])[1], 2)
        except Exception as e:  # noqa: BLE001  (an OOM of batched_mm's gathered weights, a missing kernel)
            errors[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        finally:
            out = xi = None
            if a.device == "cuda":
                torch.cuda.empty_cache()
    best = min(ms, key=ms.get) if ms else "grouped_mm"
    return dict(shape=a.shape, layers=cfg.num_hidden_layers, mode="probe", ok=bool(ms), best=best, ms=ms, errors=errors, tokens=a.batch * a.seq)


def quantised_summary(model):
    """What bitsandbytes (or Unsloth) made 4-bit and what it left in 16 bits, by kind, in GiB on the device."""
    import torch
    out = {"4bit_GiB": 0.0, "16bit_GiB": 0.0, "4bit_tensors": 0, "experts_4bit": 0, "experts_16bit": 0,
           "linear4bit_modules": 0}
    for m in model.modules():
        if type(m).__name__ == "Linear4bit":
            out["linear4bit_modules"] += 1
    for n, p in model.named_parameters():
        four = type(p).__name__ == "Params4bit" or p.dtype == torch.uint8
        size = p.numel() * p.element_size()
        out["4bit_GiB" if four else "16bit_GiB"] += size / 2**30
        out["4bit_tensors"] += four
        if "experts" in n and "lora" not in n:
            out["experts_4bit" if four else "experts_16bit"] += 1
    out["4bit_GiB"], out["16bit_GiB"] = round(out["4bit_GiB"], 3), round(out["16bit_GiB"], 3)
    return out


def drawn_in_memory(a, dtype):
    """The base drawn on the device (from_config under seed 0): no checkpoint to write or read."""
    import torch
    from transformers import AutoModelForCausalLM
    cfg = hf_config(a)
    cfg._experts_implementation = a.experts
    with torch.device(a.device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")


def quantise_in_memory(model, qc, device):
    """What from_pretrained(quantization_config=qc) does to a model's layers, on one drawn in memory:
    transformers' own list of modules to leave alone (the bnb quantizer's get_modules_to_not_convert: the
    output embedding, tied and last modules, _keep_in_fp32_modules) and its test (a module whose type is
    nn.Linear, should_convert_module), each such layer replaced by a bitsandbytes Linear4bit whose weight
    bitsandbytes quantises on the device (Params4bit.to), and the flag PEFT reads to wrap them
    (is_loaded_in_4bit)."""
    import bitsandbytes as bnb
    import torch
    from transformers.quantizers.auto import AutoHfQuantizer
    from transformers.quantizers.quantizers_utils import should_convert_module
    quantizer = AutoHfQuantizer.from_config(qc, pre_quantized=False)
    skip = quantizer.get_modules_to_not_convert(model, qc.llm_int8_skip_modules, model._keep_in_fp32_modules)
    for name, module in list(model.named_modules()):
        if type(module) is not torch.nn.Linear or not should_convert_module(name, skip):
            continue
        q = bnb.nn.Linear4bit(module.in_features, module.out_features, module.bias is not None,
                              qc.bnb_4bit_compute_dtype, compress_statistics=qc.bnb_4bit_use_double_quant,
                              quant_type=qc.bnb_4bit_quant_type, quant_storage=qc.bnb_4bit_quant_storage,
                              device="meta")
        q.weight = bnb.nn.Params4bit(module.weight.data, requires_grad=False,
                                     compress_statistics=qc.bnb_4bit_use_double_quant, quant_type=qc.bnb_4bit_quant_type,
                                     quant_storage=qc.bnb_4bit_quant_storage, module=q).to(device)
        if module.bias is not None:
            q.bias = torch.nn.Parameter(module.bias.data, requires_grad=False)
        q.source_cls = torch.nn.Linear
        q.requires_grad_(False)
        model.set_submodule(name, q)
    model.is_loaded_in_4bit = True
    return model


def run_mode(a, mode):
    os.makedirs("/tmp/unsloth_bench_work", exist_ok=True)
    os.chdir("/tmp/unsloth_bench_work")
    unsloth = mode.startswith("unsloth")
    if unsloth:
        import unsloth as us  # noqa: F401  (before transformers / peft: it patches them)
        from unsloth import FastModel
    import torch
    if mode == "probe":
        return probe(a)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    gc = mode in ("peft-gc", "bnb-gc", "unsloth", "unsloth-qlora")
    expert_lora = os.environ.get("MOE_PEER_EXPERT_LORA", "1") == "1"
    info = dict(shape=a.shape, layers=moe_model.config(a.shape, a.layers or None)["num_hidden_layers"],
                who=who(mode, a.experts) + ("" if expert_lora or unsloth else " [attention LoRA only]"),
                mode=mode, peer="unsloth" if unsloth else "transformers", gc=gc,
                base="nf4" if mode.startswith("bnb") or "qlora" in mode else "bf16",
                batch=a.batch, seq=a.seq, torch=torch.__version__)
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    torch.manual_seed(0)
    if unsloth:
        q = "qlora" in mode
        path = unsloth_family.with_tokenizer(a.model_dir, f"{a.shape}-L{info['layers']}")
        gcm = "unsloth" if gc else False
        model, _ = FastModel.from_pretrained(path, max_seq_length=a.seq, dtype=dtype, load_in_4bit=q,
                                             load_in_16bit=not q, full_finetuning=False,
                                             use_gradient_checkpointing=gcm)
        info["weights_GiB"] = gib(torch.cuda.memory_allocated()) if cuda else None
        if q:
            info["quantised"] = quantised_summary(model)
        model = FastModel.get_peft_model(model, r=16, lora_alpha=32, lora_dropout=0, bias="none",
                                         target_modules=ATTENTION + ["gate_proj", "up_proj", "down_proj"],
                                         use_gradient_checkpointing=gcm, random_state=3407, max_seq_length=a.seq)
        info["unsloth"] = us.__version__
        info["target_parameters"] = sorted(getattr(model.peft_config["default"], "target_parameters", None) or [])
    else:
        kw = dict(dtype=dtype, attn_implementation="sdpa", experts_implementation=a.experts)
        from_folder = os.environ.get("MOE_PEER_SOURCE", "init") == "folder" and a.model_dir
        if mode.startswith("bnb"):
            from transformers import BitsAndBytesConfig
            qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                    bnb_4bit_compute_dtype=dtype)
            if from_folder:
                model = AutoModelForCausalLM.from_pretrained(a.model_dir, device_map={"": a.device},
                                                             quantization_config=qc, **kw)
                info["source"] = "folder"
            else:
                model = drawn_in_memory(a, dtype)
                quantise_in_memory(model, qc, a.device)
                info["source"] = "init (seed 0, in memory), nn.Linear layers quantised as from_pretrained does"
            info["quantised"] = quantised_summary(model)
            if os.environ.get("MOE_BNB_PREPARE", "0") == "1":
                from peft import prepare_model_for_kbit_training
                model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
                info["prepare_model_for_kbit_training"] = True
        elif from_folder:
            model = AutoModelForCausalLM.from_pretrained(a.model_dir, device_map={"": a.device}, **kw)
            info["source"] = "folder"
        else:
            model = drawn_in_memory(a, dtype)
            info["source"] = "init (seed 0, in memory)"
        info["weights_GiB"] = gib(torch.cuda.memory_allocated()) if cuda else None
        for p in model.parameters():
            p.requires_grad_(False)
        if gc:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM", target_modules=ATTENTION,
                          target_parameters=EXPERT_PARAMETERS if expert_lora else None)
        model = get_peft_model(model, lora)
        for p in model.parameters():  # the adapters in f32 (train_peer.py's choice), the base as loaded
            if p.requires_grad:
                p.data = p.data.float()
        info["target_parameters"] = EXPERT_PARAMETERS if expert_lora else []
    model.train()  # from_pretrained returns eval mode; checkpointing acts only in training mode
    info["experts_impl"] = getattr(model.config, "_experts_implementation", None)
    params = [p for p in model.parameters() if p.requires_grad]
    info["trainable_params"] = sum(p.numel() for p in params)
    info["expert_lora_params"] = sum(p.numel() for n, p in model.named_parameters()
                                     if p.requires_grad and "experts" in n)
    info["router_trainable"] = any(p.requires_grad for n, p in model.named_parameters()
                                   if ".gate." in n and "lora" not in n)
    info["load_s"] = round(time.time() - t0, 1)
    opt = torch.optim.AdamW(params, lr=2e-4, fused=cuda)
    autocast = os.environ.get("MOE_PEER_AUTOCAST", "1") == "1" and dtype == torch.bfloat16
    gen = torch.Generator(device=a.device).manual_seed(0)

    def step():
        ids = torch.randint(0, 1200, (a.batch, a.seq), device=a.device, generator=gen)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    times = []
    for i in range(a.warmup + a.steps):
        sync(a.device)
        t = time.perf_counter()
        loss = step()
        sync(a.device)
        times.append(time.perf_counter() - t)
    timed = sorted(times[a.warmup:])
    step_s = timed[len(timed) // 2]
    prof_path = os.environ.get("MOE_PEER_PROFILE", "")
    if prof_path and cuda:  # one more step under torch's profiler: its kernels, by GPU time (after the timing)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync(a.device)
        with open(prof_path.replace("{mode}", mode), "w") as f:
            f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=70))
    if unsloth:  # which MoE backend Unsloth's experts forward used
        try:
            from unsloth_zoo.temporary_patches.moe_utils import select_moe_backend
            info["unsloth_moe_backend"] = select_moe_backend()
        except Exception as e:  # noqa: BLE001
            info["unsloth_moe_backend"] = f"unknown ({type(e).__name__})"
    return dict(info, ok=True, tok_s=round(a.batch * a.seq / step_s, 1), step_s=round(step_s, 4),
                peak_GiB=gib(torch.cuda.max_memory_allocated()) if cuda else None, loss=round(float(loss), 4))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shape", choices=sorted(moe_model.SHAPES))
    p.add_argument("modes", nargs="+", choices=MODES)
    p.add_argument("--model-dir", default="")
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--batch", type=int, default=0, help="rows a step (default: the shape's)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=8, help="timed steps, after --warmup")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f32"))
    p.add_argument("--experts", default="grouped_mm", help="transformers' experts implementation for peft / bnb")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_intermixed_args(argv)
    a.batch = a.batch or moe_model.SHAPES[a.shape]["batch"]
    return a


def main(argv):
    a = parse(argv)
    if a.child:
        print(json.dumps(run_mode(a, a.modes[0])), flush=True)
        return 0
    for mode in a.modes:
        folder = mode.startswith("unsloth") or (mode.startswith("bnb") and os.environ.get("MOE_PEER_SOURCE") == "folder")
        if folder and not a.model_dir:
            print(json.dumps({"shape": a.shape, "who": who(mode, a.experts), "mode": mode, "ok": False,
                              "error": "needs --model-dir (a folder written by moe_model.py)"}), flush=True)
            continue
        args = [x for x in argv if x not in MODES]
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), *args, mode, "--child"], capture_output=True,
                               text=True, timeout=int(os.environ.get("BENCH_MODE_TIMEOUT_S", "600")))
            lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
            if lines:
                print(lines[-1], flush=True)
                continue
            tail = [l for l in (r.stderr or "").splitlines() if l.strip()][-3:]
            err = " | ".join(tail) if tail else f"exit {r.returncode}"
        except subprocess.TimeoutExpired:
            err = "timed out"
        layers = moe_model.config(a.shape, a.layers or None)["num_hidden_layers"]
        print(json.dumps({"shape": a.shape, "layers": layers, "who": who(mode, a.experts), "mode": mode,
                          "batch": a.batch, "seq": a.seq, "ok": False, "error": err[-600:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
