#!/usr/bin/env python3
"""End-to-end LoRA training throughput of the PyTorch peer (transformers + PEFT) on the same
model and token budget as `loom train`: python3 bench/train_peer.py MODEL_DIR --seq-len 512
--batch-size 8 --steps 30. Prints and writes (--out) the median tokens/s over the steps after
warm-up. bf16 weights, LoRA r=16 on all seven projections in f32, torch AdamW (fused), sdpa."""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--seq-len", type=int, default=512)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--attn", default="sdpa")
p.add_argument("--out", default="")
p.add_argument("--gc", action="store_true", help="gradient checkpointing (transformers' own, non-reentrant)")
p.add_argument("--json-shape", default="", help="tag the JSON line with this shape name (bench/e2e/run.sh)")
a = p.parse_args()
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation=a.attn).cuda()
cfg = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                 "qkv_proj", "gate_up_proj"])
if a.gc:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
model = get_peft_model(model, cfg)
model.train()  # from_pretrained returns eval mode
for n, prm in model.named_parameters():
    if prm.requires_grad:
        prm.data = prm.data.float()
opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=2e-4, fused=True)
vocab = model.config.vocab_size
times = []
for step in range(a.steps):
    ids = torch.randint(0, min(vocab, 1200), (a.batch_size, a.seq_len), device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_([q for q in model.parameters() if q.requires_grad], 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
tok_s = [a.batch_size * a.seq_len / t for t in times[a.warmup:]]
res = {"peer": f"transformers+peft ({a.attn})", "tokens_per_s": statistics.median(tok_s),
       "peak_mem_bytes": torch.cuda.max_memory_allocated(), "loss": float(loss)}
if a.json_shape:  # bench/e2e/run.sh's schema
    res = {"shape": a.json_shape, "who": f"transformers+peft ({a.attn}){' + gradient checkpointing' if a.gc else ''}",
           "batch": a.batch_size, "seq": a.seq_len, "ok": True, "tok_s": round(statistics.median(tok_s)),
           "peak_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2), "loss": float(loss)}
print(json.dumps(res))
if a.out:
    json.dump(res, open(a.out, "w"))
