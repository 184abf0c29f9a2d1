#!/usr/bin/env python3
"""Loads an adapter written by Loom into PEFT on top of a fixture's base model and compares the
logits with the PEFT reference: python3 tools/check/check_peft_adapter.py ADAPTER_DIR VARIANT_DIR [--tol 1e-5].
Exits non-zero when the relative L2 error exceeds the tolerance (f32 on the CPU on both sides)."""
import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

p = argparse.ArgumentParser()
p.add_argument("adapter")
p.add_argument("variant")
p.add_argument("--tol", type=float, default=1e-5)
a = p.parse_args()
base = AutoModelForCausalLM.from_pretrained(a.variant, dtype=torch.float32, attn_implementation="eager")
model = PeftModel.from_pretrained(base, a.adapter).eval()
inputs = load_file(os.path.join(a.variant, "inputs.safetensors"))
ref = load_file(os.path.join(a.variant, "reference_lora.safetensors"))
with torch.no_grad():
    logits = model(input_ids=inputs["input_ids"].long()).logits.float()
err = ((logits - ref["logits"]).norm() / ref["logits"].norm()).item()
print(f"{a.adapter}: PEFT logits vs reference rel err {err:.3g} (tol {a.tol:g})")
sys.exit(0 if err <= a.tol else 1)
