#!/usr/bin/env python3
"""Checks that the MoE benchmark's in-memory QLoRA peer (bench/e2e/moe_peer.py's quantise_in_memory, used where
the bf16 folder does not fit the GPU machine's disk) makes the model transformers + bitsandbytes make from a
folder: it writes a small random folder of a shape (bench/e2e/moe_model.py), loads it twice, once through
from_pretrained(quantization_config=BitsAndBytesConfig(NF4, double quantisation)) and once in 16 bits then
through quantise_in_memory, and compares the two module by module (types) and tensor by tensor (the 4-bit codes,
the quantisation states, everything left in 16 bits), bit for bit. Prints one line; exits non-zero on a difference.

  python3 tools/check/check_bnb_in_memory.py [SHAPE] [--layers N] [--device cuda|cpu] [--dtype bf16|f32]

SHAPE defaults to qwen3moe_tiny (mixtral_tiny, or any shape of moe_model.py that fits). Needs torch,
transformers 5.x and bitsandbytes (on the GPU machine: .peers' wheel). Session 43 ran it on the CPU machine
(torch 2.15 CPU, transformers 5.17, bitsandbytes 0.50.2, f32): 65 entries, none different.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "e2e"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3moe_tiny")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="f32", choices=["bf16", "f32"])
    a = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    import moe_model
    import moe_peer

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                            bnb_4bit_compute_dtype=dtype)
    with tempfile.TemporaryDirectory() as d:
        moe_model.write_model(a.shape, d, a.layers, 0, a.device)
        ref = AutoModelForCausalLM.from_pretrained(d, device_map={"": a.device}, quantization_config=qc, dtype=dtype)
        mem = AutoModelForCausalLM.from_pretrained(d, device_map={"": a.device}, dtype=dtype)
        moe_peer.quantise_in_memory(mem, qc, a.device)
    bad = []
    types_ref = {n: type(m).__name__ for n, m in ref.named_modules()}
    types_mem = {n: type(m).__name__ for n, m in mem.named_modules()}
    if types_ref != types_mem:
        bad += [f"module {n}: {types_ref.get(n)} against {types_mem.get(n)}" for n in sorted(set(types_ref) | set(types_mem))
                if types_ref.get(n) != types_mem.get(n)]
    sr, sm = ref.state_dict(), mem.state_dict()
    if list(sr) != list(sm):
        bad.append(f"state dict keys differ: {sorted(set(sr) ^ set(sm))[:6]}")
    for k in sr:
        if k in sm and (sr[k].dtype != sm[k].dtype or sr[k].shape != sm[k].shape or
                        not torch.equal(sr[k].cpu().contiguous().view(torch.uint8), sm[k].cpu().contiguous().view(torch.uint8))):
            bad.append(f"{k}: {sr[k].dtype} {tuple(sr[k].shape)} against {sm[k].dtype} {tuple(sm[k].shape)}")
    four = sum(type(m).__name__ == "Linear4bit" for m in mem.modules())
    if four == 0:
        bad.append("no Linear4bit module at all")
    print(f"check_bnb_in_memory {a.shape} {a.layers} layers {a.device} {a.dtype}: {len(sr)} entries, {four} Linear4bit, "
          + ("the same bits" if not bad else f"{len(bad)} differences: " + "; ".join(bad[:8])))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
