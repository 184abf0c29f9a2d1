#!/usr/bin/env python3
"""The transformers + PEFT peer of a --device-map run (issue 35, the tutorial's setup): a model split
over the visible GPUs by accelerate's device_map="auto" (max_memory optional), LoRA r16 alpha 32 on
the seven projections in f32, torch AdamW (fused), sdpa, random token ids, batch x seq tokens a step.
Prints one JSON line: median tokens/s past warm-up, each GPU's peak memory (torch's count), the
device map accelerate chose, and the per-step losses.

  python3 bench/e2e/device_map_peer.py MODEL_DIR --batch-size 4 --seq-len 2048 --steps 8 \
      [--max-memory 0=70GiB,1=70GiB] [--gc] [--json-shape 8b]
"""
import argparse
import collections
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
p.add_argument("--seq-len", type=int, default=2048)
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--max-memory", default="", help="accelerate's max_memory as 0=70GiB,1=70GiB,cpu=100GiB")
p.add_argument("--gc", action="store_true", help="gradient checkpointing (non-reentrant)")
p.add_argument("--device", default="cuda", help="cuda (device_map auto over the GPUs) or cpu (a check of the script)")
p.add_argument("--json-shape", default="")
a = p.parse_args()
torch.manual_seed(0)

max_memory = None
if a.max_memory:
    max_memory = {}
    for part in a.max_memory.split(","):
        k, v = part.split("=")
        k = k.strip().removeprefix("cuda:")
        max_memory[int(k) if k.isdigit() else k] = v.strip()
kw = {"device_map": "auto", "max_memory": max_memory} if a.device == "cuda" else {}
dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa", **kw)
placement = dict(getattr(model, "hf_device_map", {}) or {"": a.device})
if a.gc:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                         "down_proj"]))
model.train()
for prm in model.parameters():
    if prm.requires_grad:
        prm.data = prm.data.float()
params = [q for q in model.parameters() if q.requires_grad]
opt = torch.optim.AdamW(params, lr=2e-4, fused=a.device == "cuda")
first = next(model.parameters()).device  # where the embedding is: the inputs go there
gpus = torch.cuda.device_count() if a.device == "cuda" else 0
vocab = model.config.vocab_size
times, losses = [], []
for step in range(a.steps):
    ids = torch.randint(0, min(vocab, 1200), (a.batch_size, a.seq_len), device=first)
    for g in range(gpus):
        torch.cuda.synchronize(g)
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for g in range(gpus):
        torch.cuda.synchronize(g)
    times.append(time.perf_counter() - t0)
    losses.append(float(loss.detach()))
tok_s = [a.batch_size * a.seq_len / t for t in times[a.warmup:] or times]
where = collections.Counter(str(d) for d in placement.values())
print(json.dumps({"shape": a.json_shape, "who": "transformers+peft device_map=auto" + (" + gc" if a.gc else ""),
                  "batch": a.batch_size, "seq": a.seq_len, "ok": True, "tok_s": round(statistics.median(tok_s)),
                  "peak_GiB_per_gpu": [round(torch.cuda.max_memory_allocated(g) / 2**30, 2) for g in range(gpus)],
                  "modules_per_device": dict(where), "losses": losses}))
