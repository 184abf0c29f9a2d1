#!/usr/bin/env python3
"""Quantises the tiny fixture families with transformers + bitsandbytes (NF4, double quantisation)
and dumps what Loom's 4-bit tests compare against, into tests/fixtures/bnb/models/<family>/.

Run on the GPU machine from the repository root (torch, transformers 5.x, peft, safetensors; the
bitsandbytes wheel of ../shared/peers installed or put on PYTHONPATH):

  python3 -m pip install -q --no-index --no-deps --target /tmp/bnb ../shared/peers/bitsandbytes-*.whl
  PYTHONPATH=/tmp/bnb python3 tools/reference/make_bnb_model_reference.py [--only llama,qwen2] [--out DIR]

Per family (source: tests/fixtures/models/<family>/, an f32 checkpoint with inputs and a PEFT adapter):
  config.json, model.safetensors   AutoModelForCausalLM.from_pretrained(src, quantization_config=
                                   BitsAndBytesConfig(load_in_4bit, nf4, double quant, compute f32),
                                   dtype=float32, eager attention, on cuda:0).save_pretrained(...):
                                   exactly what transformers + bitsandbytes write (`loom quantize` of
                                   the source folder must give the same tensors).
  reference_4bit.safetensors       "logits" f32 [2, 12, vocab] and "loss" [1] of that 4-bit model on
                                   the source inputs.safetensors; "dequant.<weight name>" f32 [out, in]
                                   = bitsandbytes.functional.dequantize_4bit of every 4-bit weight;
                                   with the source adapter loaded through PEFT (is_trainable, f32 LoRA):
                                   "lora_logits", "lora_loss", and "grad.<adapter tensor name>" of
                                   loss.backward() (names as in adapter_model.safetensors).
The metadata records the versions and the device. Checks made here: the saved folder reloads to the
same logits; every decoder Linear weight is 4-bit with the six companion tensors; lm_head,
embeddings and norms stay f32; the 4-bit logits stay near the f32 reference (4-bit error only).
"""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
SRC = REPO_ROOT / "tests" / "fixtures" / "models"
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "bnb" / "models"
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gemma3"]
LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FUSED_LINEARS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]  # phi3 keeps them fused


def linears_of(family):
    return FUSED_LINEARS if family.startswith("phi3") else LINEARS
COMPANIONS = [".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4"]


def log(msg):
    print(msg, flush=True)


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def bnb_config():
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)


def load_4bit(path):
    """The f32 fixture quantised on load (transformers' own path), on cuda:0."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), quantization_config=bnb_config(), dtype=torch.float32, attn_implementation="eager",
        device_map={"": 0}).eval()


def run(model, ids, labels=None):
    out = model(input_ids=ids, labels=labels, use_cache=False)
    return out.logits, out.loss


def make_family(name, out_dir):
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf
    from peft import PeftModel

    src, dst = SRC / name, out_dir / name
    if dst.exists():
        shutil.rmtree(dst)
    log(f"== {name}: {src} -> {dst}")
    inputs = load_file(str(src / "inputs.safetensors"))
    ids = inputs["input_ids"].long().cuda()
    labels = inputs["labels"].long().cuda()
    f32_ref = load_file(str(src / "reference.safetensors"))

    model = load_4bit(src)
    with torch.no_grad():
        logits, loss = run(model, ids, labels)
    drift = rel_err(logits, f32_ref["logits"])
    log(f"  4-bit logits vs f32 reference: rel {drift:.3g}, loss {float(loss):.5f} (f32 {float(f32_ref['loss']):.5f})")
    assert 1e-5 < drift < 0.3, f"4-bit logits rel error {drift} is not a 4-bit quantisation error"

    tensors = {"logits": logits.float().cpu(), "loss": loss.float().reshape(1).cpu()}
    n4 = 0
    for mname, mod in model.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            qs = mod.weight.quant_state
            assert qs.quant_type == "nf4" and qs.blocksize == 64 and qs.nested, (mname, qs.quant_type, qs.blocksize)
            tensors[f"dequant.{mname}.weight"] = bnbf.dequantize_4bit(mod.weight.data, qs).float().cpu()
            n4 += 1
    n_layers = model.config.num_hidden_layers
    lins = linears_of(src.name)
    assert n4 == len(lins) * n_layers, f"{n4} Linear4bit modules, expected {len(lins) * n_layers}"

    model.save_pretrained(str(dst), safe_serialization=True)
    saved = load_file(str(dst / "model.safetensors"))
    for i in range(n_layers):
        for lin in lins:
            part = "self_attn" if lin in ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj") else "mlp"
            w = f"model.layers.{i}.{part}.{lin}.weight"
            assert saved[w].dtype == torch.uint8, (w, saved[w].dtype)
            for c in COMPANIONS:
                assert w + c in saved, f"{w + c} missing from the saved checkpoint"
    for k, v in saved.items():
        if "embed" in k or "norm" in k or k.startswith("lm_head"):
            assert v.dtype == torch.float32, (k, v.dtype)
    cfg = json.loads((dst / "config.json").read_text())
    log(f"  saved {len(saved)} tensors; quantization_config {json.dumps(cfg['quantization_config'], sort_keys=True)}")
    first = f"model.layers.0.self_attn.{lins[0]}.weight"
    qs0 = bytes(saved[first + ".quant_state.bitsandbytes__nf4"].tolist()).decode()
    log(f"  quant_state of layer 0 {lins[0]}: {qs0}")

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(dst), dtype=torch.float32,
                                                                 attn_implementation="eager",
                                                                 device_map={"": 0}).eval()
    with torch.no_grad():
        again = rel_err(run(reloaded, ids)[0], logits)
    assert again < 1e-6, f"the saved 4-bit checkpoint reloads to logits {again:.3g} away"
    del reloaded

    # PEFT LoRA over the 4-bit base: the source adapter, trainable, f32.
    pm = PeftModel.from_pretrained(model, str(src / "adapter"), is_trainable=True)
    pm.eval()
    params = {n: p for n, p in pm.named_parameters() if p.requires_grad}
    lora_logits, lora_loss = run(pm, ids, labels)
    lora_loss.backward()
    tensors["lora_logits"] = lora_logits.detach().float().cpu()
    tensors["lora_loss"] = lora_loss.detach().float().reshape(1).cpu()
    adapter_names = set(load_file(str(src / "adapter" / "adapter_model.safetensors")))
    for n, p in params.items():
        k = n.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
        assert k in adapter_names, f"{k} is not an adapter tensor name"
        assert p.dtype == torch.float32 and p.grad is not None, (k, p.dtype)
        tensors[f"grad.{k}"] = p.grad.detach().float().cpu()
    f32_lora = load_file(str(src / "reference_lora.safetensors"))
    log(f"  lora: loss {float(lora_loss):.5f} (f32 {float(f32_lora['loss']):.5f}), logits rel "
        f"{rel_err(lora_logits, f32_lora['logits']):.3g}, worst grad rel "
        f"{max(rel_err(tensors['grad.' + k], f32_lora['grad.' + k]) for k in adapter_names):.3g}")

    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "bitsandbytes": bnb.__version__,
            "peft": __import__("peft").__version__, "device": torch.cuda.get_device_name(),
            "quantization": "nf4, blocksize 64, double quant (nested blocksize 256), compute dtype float32",
            "attn_implementation": "eager", "inputs": f"tests/fixtures/models/{name}/inputs.safetensors",
            "adapter": f"tests/fixtures/models/{name}/adapter"}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "reference_4bit.safetensors"), meta)
    return {"logits_vs_f32": drift, "tensors": len(saved)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--only", default="", help="comma-separated families (default: all)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("make_bnb_model_reference.py: bitsandbytes 4-bit needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 GEMMs, as Loom's CPU reference computes
    names = [n for n in args.only.split(",") if n] or FAMILIES
    for n in names:
        if n not in FAMILIES:
            sys.exit(f"unknown family {n}; choose from {FAMILIES}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {n: make_family(n, out) for n in names}
    log(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
