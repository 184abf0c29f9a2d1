#!/usr/bin/env python3
"""The DPO peers of the preference benchmark (bench/e2e/dpo.sh): TRL 1.15 DPOTrainer + PEFT and Unsloth
2026.10.9's patched DPOTrainer, on the random-init folder Loom trains (bench/e2e/model.sh) and the same pairs
file (bench/e2e/preference_pairs.py), LoRA r16 on every projection, bf16, fused AdamW, sigmoid loss at beta
0.1, the reference being the policy with its adapters off (what Loom does); one JSON line per mode.

    PYTHONPATH=/tmp/site python3 bench/e2e/dpo_peer.py MODEL_DIR SHAPE PAIRS.jsonl BATCH MAX_LEN MODE [MODE ...]

MODE: trl | trl-gc (gradient checkpointing) | trl-precompute (precompute_ref_log_probs) | unsloth (its
"unsloth" checkpointing) | unsloth-nogc | unsloth-fused (UNSLOTH_FUSED_PREFERENCE_LOSS=1, its chunked
preference loss). Each mode runs in a child process (an OOM cannot take the next down). pairs_s is BATCH over the
median step time past the warm-up; peak_GiB is torch.cuda.max_memory_allocated over load and training.
Env: BENCH_WARMUP (3), BENCH_STEPS (8), BENCH_MODE_TIMEOUT_S (400).
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import unsloth_family  # noqa: E402  (its import sets the offline environment both peers need)

WARMUP = int(os.environ.get("BENCH_WARMUP", "3"))
STEPS = int(os.environ.get("BENCH_STEPS", "8"))
TARGETS = unsloth_family.TARGETS  # every projection, separate or fused


def run_mode(model_dir, shape, pairs, B, L, mode):
    os.makedirs("/tmp/unsloth_bench_work", exist_ok=True)
    os.chdir("/tmp/unsloth_bench_work")
    unsloth = mode.startswith("unsloth")
    if mode == "unsloth-fused":
        os.environ["UNSLOTH_FUSED_PREFERENCE_LOSS"] = "1"
    if unsloth:
        import unsloth as us  # noqa: F401  (before trl / transformers / peft: it patches DPOTrainer)
        from unsloth import FastLanguageModel
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    path = unsloth_family.with_tokenizer(model_dir, shape)
    tok = AutoTokenizer.from_pretrained(path)
    info = dict(mode=f"{shape}-dpo-{mode}", B=B, max_len=L, torch=torch.__version__)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    gc = mode in ("trl-gc", "unsloth", "unsloth-fused")
    if unsloth:
        model, _ = FastLanguageModel.from_pretrained(path, max_seq_length=L, dtype=torch.bfloat16, load_in_4bit=False)
        present = {n.split(".")[-1] for n, _ in model.named_modules()}
        model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0,
                                                 target_modules=[t for t in TARGETS if t in present], bias="none",
                                                 use_gradient_checkpointing="unsloth" if gc else False,
                                                 random_state=3407, max_seq_length=L)
        peft_config = None
        info["unsloth"] = us.__version__
    else:
        from peft import LoraConfig
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
        present = {n.split(".")[-1] for n, _ in model.named_modules()}
        peft_config = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                                 target_modules=[t for t in TARGETS if t in present])
    data = load_dataset("json", data_files=pairs, split="train")
    step_times, marks = [], {}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            torch.cuda.synchronize()
            marks["t"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            step_times.append(time.perf_counter() - marks["t"])

    cfg = DPOConfig(output_dir="/tmp/unsloth_bench_work/dpo-out", per_device_train_batch_size=B, max_length=L,
                    max_steps=WARMUP + STEPS, learning_rate=1e-5, beta=0.1, loss_type=["sigmoid"], bf16=True,
                    optim="adamw_torch_fused", gradient_checkpointing=gc and not unsloth, logging_steps=1,
                    report_to=[], save_strategy="no", lr_scheduler_type="constant", dataloader_num_workers=0,
                    precompute_ref_log_probs=mode == "trl-precompute", seed=0, disable_dropout=True)
    trainer = DPOTrainer(model=model, args=cfg, train_dataset=data, processing_class=tok, peft_config=peft_config,
                         callbacks=[Clock()])
    info["load_s"] = round(time.time() - t0, 1)
    t1 = time.time()
    out = trainer.train()
    info["train_s"] = round(time.time() - t1, 1)  # with precompute_ref_log_probs: the precompute pass too
    timed = sorted(step_times[WARMUP:]) or sorted(step_times)
    step_s = timed[len(timed) // 2]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    print(json.dumps(dict(info, ok=True, pairs_s=round(B / step_s, 2), step_s=round(step_s, 4),
                          peak_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 2),
                          loss=round(logs[-1]["loss"], 4) if logs else out.training_loss,
                          accuracy=logs[-1].get("rewards/accuracies") if logs else None)), flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        model_dir, shape, pairs, B, L, mode = sys.argv[2:8]
        run_mode(model_dir, shape, pairs, int(B), int(L), mode)
        return 0
    model_dir, shape, pairs, B, L, *modes = sys.argv[1:]
    for mode in modes:
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", model_dir, shape, pairs, B, L, mode],
                               capture_output=True, text=True, timeout=int(os.environ.get("BENCH_MODE_TIMEOUT_S", "400")))
            lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
            if lines:
                print(lines[-1], flush=True)
                continue
            tail = [l for l in (r.stderr or "").splitlines() if l.strip()][-3:]
            err = " | ".join(tail) if tail else f"exit {r.returncode}"
        except subprocess.TimeoutExpired:
            err = "timed out"
        print(json.dumps({"mode": f"{shape}-dpo-{mode}", "ok": False, "error": err[-600:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
