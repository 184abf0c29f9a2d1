#!/usr/bin/env python3
"""Unsloth 2026.10.9 LoRA on the e2e scoreboard's family shapes (Phi-3.5-mini, Gemma-3-4B), as
../shared/peers/unsloth_bench.py runs the Llama shapes: the same random-init folder Loom and PEFT
train (bench/e2e/model.sh), bf16, LoRA r16 on every projection, fused AdamW, bf16 autocast,
Unsloth's gradient checkpointing ("unsloth") or none, random token ids; one JSON line per mode.

    PYTHONPATH=/tmp/site python3 bench/e2e/unsloth_family.py MODEL_DIR SHAPE BATCH SEQ MODE [MODE ...]

MODE: lora | lora-nogc. Each mode runs in a child process (an OOM cannot take the next down).
Env: BENCH_WARMUP (3), BENCH_STEPS (6), BENCH_MODE_TIMEOUT_S (300).
"""
import json
import os
import subprocess
import sys
import time

for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
             "UNSLOTH_DISABLE_STATISTICS": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1",
             "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
             "UNSLOTH_COMPILE_LOCATION": "/tmp/unsloth_bench_work/unsloth_compiled_cache",
             "HF_HOME": "/tmp/unsloth_bench_work/hf_home"}.items():
    os.environ.setdefault(k, v)

WARMUP = int(os.environ.get("BENCH_WARMUP", "3"))
STEPS = int(os.environ.get("BENCH_STEPS", "6"))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj"]


def with_tokenizer(model_dir, shape):
    """Unsloth's loader wants tokenizer_config.json: a folder of links to the weights plus a fast tokenizer
    built from the folder's tokenizer.json (the same ids Loom's data uses)."""
    from transformers import PreTrainedTokenizerFast
    d = f"/tmp/unsloth_bench_work/model-{shape}"
    if not os.path.exists(os.path.join(d, "tokenizer_config.json")):
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(model_dir):
            if f != "tokenizer.json" and not os.path.exists(os.path.join(d, f)):
                os.symlink(os.path.join(os.path.abspath(model_dir), f), os.path.join(d, f))
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"),
                                      model_max_length=131072)
        tok.add_special_tokens({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"})
        tok.padding_side = "right"
        tok.save_pretrained(d)
    return d


def run_mode(model_dir, shape, B, S, mode):
    os.makedirs("/tmp/unsloth_bench_work", exist_ok=True)
    os.chdir("/tmp/unsloth_bench_work")
    import unsloth  # noqa: F401  (before transformers / peft)
    from unsloth import FastLanguageModel, FastModel
    import torch
    gcm = False if mode.endswith("-nogc") else "unsloth"
    path = with_tokenizer(model_dir, shape)
    info = dict(mode=f"{shape}-{mode}", B=B, gc=gcm, torch=torch.__version__, unsloth=unsloth.__version__)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    try:  # Unsloth's own patched path where it has one, its generic FastModel otherwise
        model, _ = FastLanguageModel.from_pretrained(path, max_seq_length=S, dtype=torch.bfloat16, load_in_4bit=False,
                                                     use_gradient_checkpointing=gcm)
        info["loader"] = "FastLanguageModel"
    except Exception as e:  # noqa: BLE001
        info["fast_language_model_error"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        model, _ = FastModel.from_pretrained(path, max_seq_length=S, dtype=torch.bfloat16, load_in_4bit=False,
                                             use_gradient_checkpointing=gcm)
        info["loader"] = "FastModel"
    present = {n.split(".")[-1] for n, _ in model.named_modules()}
    targets = [t for t in TARGETS if t in present]
    getter = FastLanguageModel if info["loader"] == "FastLanguageModel" else FastModel
    model = getter.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0, target_modules=targets,
                                  use_gradient_checkpointing=gcm, bias="none", random_state=3407, max_seq_length=S)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    info.update(targets=targets, trainable_params=sum(p.numel() for p in params), load_s=round(time.time() - t0, 1))
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)

    def step():
        ids = torch.randint(0, 1200, (B, S), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(STEPS):
        t = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    step_s = sorted(times)[len(times) // 2]
    print(json.dumps(dict(info, ok=True, S=S, tok_s=round(B * S / step_s, 1), step_s=round(step_s, 4),
                          peak_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 2), loss=round(loss, 4))),
          flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        model_dir, shape, B, S, mode = sys.argv[2:7]
        run_mode(model_dir, shape, int(B), int(S), mode)
        return 0
    model_dir, shape, B, S, *modes = sys.argv[1:]
    for mode in modes:
        try:
            r = subprocess.run([sys.executable, __file__, "--child", model_dir, shape, B, S, mode], capture_output=True,
                               text=True, timeout=int(os.environ.get("BENCH_MODE_TIMEOUT_S", "300")))
            lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
            if lines:
                print(lines[-1], flush=True)
                continue
            tail = [l for l in (r.stderr or "").splitlines() if l.strip()][-1:]
            err = tail[0] if tail else f"exit {r.returncode}"
        except subprocess.TimeoutExpired:
            err = "timed out"
        print(json.dumps({"mode": f"{shape}-{mode}", "ok": False, "error": err[:400]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
