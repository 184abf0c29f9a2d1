#!/usr/bin/env python3
"""Full fine-tuning throughput of PyTorch's data parallelism on the same model and batch as
`mpirun -np N loom train --full --dist ddp|zero2`: torchrun --nproc-per-node N bench/dist_peer.py
MODEL_DIR --mode ddp|fsdp2 --seq-len 2048 --batch-size 4 --steps 20. ddp: DistributedDataParallel
(25 MB buckets, bf16 autocast over f32 weights). fsdp2: torch.distributed.fsdp.fully_shard with
reshard_after_forward=False (ZeRO-2: parameters stay gathered, gradients and optimizer state are
sharded), bf16 parameters with f32 reduction via MixedPrecisionPolicy. torch AdamW (fused), sdpa.
Rank 0 prints one JSON line: global tokens/s (median after warm-up) and peak memory per GPU."""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--mode", choices=["ddp", "fsdp2"], default="ddp")
p.add_argument("--seq-len", type=int, default=2048)
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=5)
a = p.parse_args()
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa").cuda()
model.train()
if a.mode == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)
else:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    autocast = torch.autocast("cuda", enabled=False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
vocab = 1200
times = []
for step in range(a.steps):
    ids = torch.randint(0, vocab, (a.batch_size, a.seq_len), device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with autocast:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
tok = a.batch_size * a.seq_len * world
if rank == 0:
    print(json.dumps({"peer": f"torch {a.mode} (full, bf16)", "world": world,
                      "tokens_per_s": tok / statistics.median(times[a.warmup:]),
                      "peak_mem_bytes": torch.cuda.max_memory_allocated()}))
dist.destroy_process_group()
