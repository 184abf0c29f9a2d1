#!/usr/bin/env python3
"""Turns bench/e2e/run.sh's JSON lines into the scoreboard: per shape, each run's tokens/s, peak GPU
memory, MFU (model FLOPs of LoRA training: forward 2N + input-gradient 2N per token over every
linear incl. lm_head, plus causal attention at 3.5x its forward; recomputation not counted) against
the H200's 989 TFLOP/s dense bf16, and the ratios to transformers + PEFT and to Unsloth."""
import json
import sys

PEAK = 989e12
SHAPES = {"1b": dict(h=2048, i=8192, layers=16, kv=512, vocab=128256, seq=2048),
          "8b": dict(h=4096, i=14336, layers=32, kv=1024, vocab=128256, seq=2048)}


def flops_per_token(shape, seq):
    s = SHAPES[shape]
    per_layer = 2 * s["h"] * s["h"] + 2 * s["h"] * s["kv"] + 3 * s["h"] * s["i"]
    n = s["layers"] * per_layer + s["vocab"] * s["h"]
    attention = s["layers"] * 3.5 * 2 * seq * s["h"]  # causal: half of 4*seq*h forward
    return 4 * n + attention


def rows(path):
    out = []
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        raw = r.get("raw")
        if raw is not None:  # a peer script's own line
            who = r["who"]
            if who == "unsloth":
                who = "unsloth (" + ("no checkpointing" if "nogc" in raw.get("mode", "") else "offload checkpointing") + ")"
            else:
                who = raw.get("who", who)
            r = {"shape": r["shape"], "who": who, "ok": raw.get("ok", "error" not in raw),
                 "tok_s": raw.get("tok_s"), "peak_GiB": raw.get("peak_GiB"), "error": raw.get("error")}
        out.append(r)
    return out


def main():
    data = rows(sys.argv[1])
    for shape in SHAPES:
        rs = [r for r in data if r.get("shape") == shape]
        if not rs:
            continue
        fpt = flops_per_token(shape, SHAPES[shape]["seq"])
        base = next((r["tok_s"] for r in rs if r.get("ok") and r["who"].startswith("transformers+peft (sdpa)")), None)
        uns = next((r["tok_s"] for r in rs if r.get("ok") and r["who"].startswith("unsloth (no")), None)
        print(f"\n### {shape} shape, batch {rs[0].get('batch', '')} x 2048, LoRA r16 on 7 projections, bf16\n")
        print("| run | tokens/s | peak GPU GiB | MFU | vs PEFT | vs Unsloth (no ckpt) |")
        print("|---|---|---|---|---|---|")
        for r in rs:
            if not r.get("ok"):
                print(f"| {r['who']} | failed: {r.get('error', '')} | | | | |")
                continue
            t = r["tok_s"]
            ratio = lambda b: f"{t / b:.2f}x" if b else "—"
            host = f" (+{r['host_GiB']} host)" if r.get("host_GiB") else ""
            print(f"| {r['who']} | {t:,.0f} | {r['peak_GiB']}{host} | {100 * t * fpt / PEAK:.1f}% | {ratio(base)} | {ratio(uns)} |")
        ctx = [r for r in rs if r.get("batch") == 1]
        if ctx:
            print("\nBatch 1, longest sequence: " + ", ".join(
                f"{r['seq']}: {'ok, ' + str(r['peak_GiB']) + ' GiB' if r.get('ok') else 'failed'}" for r in ctx))


if __name__ == "__main__":
    main()
