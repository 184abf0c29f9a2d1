#!/usr/bin/env python3
# Checks a merged checkpoint written by Loom (base + LoRA folded into bf16 weights) with transformers: loads it in
# f32, runs a fixture's inputs and compares the logits with the `merged_logits` that transformers + PEFT computed.
# Usage: tools/check/check_merged.py MERGED_DIR tests/fixtures/models/<variant> [--tol 3e-2]; exits 1 above the tolerance.
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def checkpoint_keys_and_dtypes(folder, safe_open):
    """{tensor name: dtype string} over model.safetensors or every shard named in the index."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        path = folder / name
        if not path.exists():
            raise SystemExit(f"check_merged: {path} is missing")
        with safe_open(str(path), framework="numpy") as f:  # header only: no torch needed
            for k in f.keys():
                out[k] = str(f.get_slice(k).get_dtype())
    return out


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def main():
    ap = argparse.ArgumentParser(description="Compare a Loom-merged checkpoint with transformers+PEFT merged logits.")
    ap.add_argument("merged_dir", help="folder with config.json + model.safetensors (or shards + index)")
    ap.add_argument("variant_dir", help="fixture folder with inputs.safetensors and reference_lora.safetensors")
    # bf16 weights carry a relative rounding error of 2^-9 ~ 2e-3 each; through two layers and the lm_head the
    # logits typically move by ~1e-2 relative. 3e-2 leaves margin while still failing a missed or doubled LoRA
    # delta (which moves the logits by the LoRA effect itself, see manifest lora_vs_base_rel, >> 3e-2).
    ap.add_argument("--tol", type=float, default=3e-2, help="max relative L2 error of the logits (default 3e-2)")
    args = ap.parse_args()

    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.torch import load_file

    merged_dir, variant_dir = Path(args.merged_dir), Path(args.variant_dir)
    for need in (merged_dir / "config.json", variant_dir / "inputs.safetensors",
                 variant_dir / "reference_lora.safetensors"):
        if not need.exists():
            raise SystemExit(f"check_merged: {need} is missing")

    config = json.loads((merged_dir / "config.json").read_text())
    dtypes = checkpoint_keys_and_dtypes(merged_dir, safe_open)
    lora_keys = [k for k in dtypes if "lora_" in k]
    print(f"merged checkpoint: {merged_dir} architectures={config.get('architectures')} "
          f"tensors={len(dtypes)} dtypes={sorted(set(dtypes.values()))}")
    if lora_keys:
        print(f"FAIL: the merged checkpoint still holds LoRA tensors, e.g. {lora_keys[:3]}")
        return 1

    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(merged_dir), **{dtype_key: torch.float32}, attn_implementation="eager").eval()
    inputs = load_file(str(variant_dir / "inputs.safetensors"))
    ref = load_file(str(variant_dir / "reference_lora.safetensors"))
    ids = inputs["input_ids"].long()
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
    want = ref["merged_logits"]
    if tuple(logits.shape) != tuple(want.shape):
        print(f"FAIL: logits shape {tuple(logits.shape)} != reference {tuple(want.shape)}")
        return 1
    if not torch.isfinite(logits).all():
        print("FAIL: non-finite logits")
        return 1

    err = rel_err(logits, want)
    err_lora = rel_err(logits, ref["logits"])
    line = f"rel L2 error vs merged_logits {err:.3e} (vs live LoRA logits {err_lora:.3e}); max abs " \
           f"{float((logits - want).abs().max()):.3e}; tol {args.tol:.1e}"
    base_path = variant_dir / "reference.safetensors"
    if base_path.exists():
        err_base = rel_err(logits, load_file(str(base_path))["logits"])
        line += f"; vs base (no LoRA) {err_base:.3e}"
        if err_base <= err:
            print(line)
            print("FAIL: the merged model is closer to the base model than to the merged reference "
                  "(the LoRA delta looks missing)")
            return 1
    print(line)
    if err > args.tol:
        print("FAIL")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
