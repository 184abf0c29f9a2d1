#!/usr/bin/env python3
"""Dumps bitsandbytes references for Loom's tests into tests/fixtures/bnb/ (small safetensors files).

Run on the GPU machine, with torch and the bitsandbytes wheel of ../shared/peers installed:
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/bitsandbytes-*.whl
  PYTHONPATH=/tmp/site python3 tools/reference/make_bnb_reference.py --out tests/fixtures/bnb

adamw8bit.safetensors: bnb.optim.AdamW8bit on CUDA from zero state, several steps on fixed inputs:
  "<case>.param.0" (f32 start), "<case>.grad.<k>" (k = 1..steps), and after step k
  "<case>.param.<k>", "<case>.state1.<k>", "<case>.state2.<k>", and for 8-bit cases
  "<case>.absmax1.<k>", "<case>.absmax2.<k>"; "qmap1"/"qmap2" (the optimizer's maps) and
  "dynamic_map.signed"/"dynamic_map.unsigned" (create_dynamic_map on this CPU). Cases: "big"
  (4096 + 300 elements: 8-bit state, a partial last block, weight decay), "lora_a" (a zero
  gradient at step 1: all-zero blocks), "small" (1000 elements: bitsandbytes' 32-bit rule).
  The metadata holds the hyper-parameters, the versions and torch's CPU capability.
nf4.safetensors: bitsandbytes.functional.quantize_4bit(..., blocksize=64, quant_type="nf4") of
  fixed inputs "<case>.input" (f32 and bf16; 300 blocks of 64 so the nested absmax has a partial
  block of 256), with compress_statistics True ("<case>.packed", ".absmax" (u8), ".offset",
  ".nested_absmax", ".nested_quant_map", ".quant_map", ".dequantized") and False
  ("<case>.plain_absmax", ".plain_packed", ".plain_dequantized").
"""
import argparse
import json
import os

import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from safetensors.torch import save_file

HP = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01, "steps": 3}


def adamw8bit(out_dir):
    g = torch.Generator().manual_seed(1234)
    cases = {"big": 4096 + 300, "lora_a": 4096, "small": 1000}
    tensors = {}
    for name, n in cases.items():
        p0 = torch.randn(n, generator=g) * 0.05
        grads = [torch.randn(n, generator=g) * 0.01 for _ in range(HP["steps"])]
        if name == "lora_a":
            grads[0].zero_()  # LoRA A's gradient is zero while B is still zero
        p = torch.nn.Parameter(p0.clone().cuda())
        opt = bnb.optim.AdamW8bit([p], lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"],
                                  weight_decay=HP["weight_decay"])
        tensors[f"{name}.param.0"] = p0
        for k, grad in enumerate(grads, start=1):
            p.grad = grad.clone().cuda()
            opt.step()
            torch.cuda.synchronize()
            st = opt.state[p]
            tensors[f"{name}.grad.{k}"] = grad
            tensors[f"{name}.param.{k}"] = p.detach().cpu().clone()
            tensors[f"{name}.state1.{k}"] = st["state1"].cpu().clone()
            tensors[f"{name}.state2.{k}"] = st["state2"].cpu().clone()
            if st["state1"].dtype == torch.uint8:
                tensors[f"{name}.absmax1.{k}"] = st["absmax1"].cpu().clone()
                tensors[f"{name}.absmax2.{k}"] = st["absmax2"].cpu().clone()
                tensors["qmap1"] = st["qmap1"].cpu().clone()
                tensors["qmap2"] = st["qmap2"].cpu().clone()
    tensors["dynamic_map.signed"] = F.create_dynamic_map(signed=True)
    tensors["dynamic_map.unsigned"] = F.create_dynamic_map(signed=False)
    meta = {"hyper_parameters": json.dumps(HP), "bitsandbytes": bnb.__version__, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "device": torch.cuda.get_device_name()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "adamw8bit.safetensors"), meta)


def nf4(out_dir):
    g = torch.Generator().manual_seed(4321)
    base = torch.randn(300 * 64, generator=g) * 0.02
    base[5] = 0.0
    base[64:128] = 0.0  # an all-zero block
    base[200] = 0.3     # an outlier
    tensors = {}
    for name, x in {"f32": base, "bf16": base.to(torch.bfloat16)}.items():
        xc = x.cuda()
        packed, qs = F.quantize_4bit(xc, blocksize=64, compress_statistics=True, quant_type="nf4")
        tensors[f"{name}.input"] = x
        tensors[f"{name}.packed"] = packed.cpu().flatten()
        tensors[f"{name}.absmax"] = qs.absmax.cpu()
        tensors[f"{name}.offset"] = qs.offset.reshape(1).float().cpu()
        tensors[f"{name}.nested_absmax"] = qs.state2.absmax.cpu()
        tensors[f"{name}.nested_quant_map"] = qs.state2.code.cpu()
        tensors[f"{name}.quant_map"] = qs.code.cpu()
        tensors[f"{name}.dequantized"] = F.dequantize_4bit(packed, qs).cpu().flatten()
        packed2, qs2 = F.quantize_4bit(xc, blocksize=64, compress_statistics=False, quant_type="nf4")
        tensors[f"{name}.plain_packed"] = packed2.cpu().flatten()
        tensors[f"{name}.plain_absmax"] = qs2.absmax.cpu()
        tensors[f"{name}.plain_dequantized"] = F.dequantize_4bit(packed2, qs2).cpu().flatten()
    meta = {"bitsandbytes": bnb.__version__, "torch": torch.__version__, "blocksize": "64",
            "nested_blocksize": "256"}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "nf4.safetensors"), meta)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/bnb")
    ap.add_argument("--only", choices=["adamw8bit", "nf4"], default=None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.only in (None, "adamw8bit"):
        adamw8bit(args.out)
    if args.only in (None, "nf4"):
        nf4(args.out)
    for f in sorted(os.listdir(args.out)):
        print(f"{os.path.join(args.out, f)}: {os.path.getsize(os.path.join(args.out, f))} bytes")


if __name__ == "__main__":
    main()
