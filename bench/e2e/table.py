#!/usr/bin/env python3
"""Turns bench/e2e/run.sh's JSON lines into the scoreboard: per shape, each run's tokens/s, peak GPU
memory, MFU (model FLOPs of LoRA training: forward 2N + input-gradient 2N per token over every
linear incl. lm_head, plus causal attention at 3.5x its forward; recomputation not counted) against
the H200's 989 TFLOP/s dense bf16, and the ratios like for like: each run against the peer with the
same checkpointing (none, or gradient / offloaded checkpointing) and the same base weights (QLoRA
runs against PEFT + bitsandbytes and Unsloth's 4-bit run where there is one), tokens/s at memory."""
import json
import sys

PEAK = 989e12
SHAPES = {"1b": dict(h=2048, i=8192, layers=16, kv=512, vocab=128256, seq=2048, batch=8),
          "8b": dict(h=4096, i=14336, layers=32, kv=1024, vocab=128256, seq=2048, batch=4),
          # q: the query width where it is not h (Gemma 3's 8 heads of 256); attention counted as full on
          # every layer (Gemma's 1024-token windows do less, so its MFU is a slight overestimate).
          "phi35": dict(h=3072, i=8192, layers=32, kv=3072, vocab=32064, seq=2048, batch=4),
          "gemma3_4b": dict(h=2560, q=2048, i=10240, layers=34, kv=1024, vocab=262208, seq=2048, batch=4)}


def flops_per_token(shape, seq):
    s = SHAPES[shape]
    q = s.get("q", s["h"])
    per_layer = 2 * s["h"] * q + 2 * s["h"] * s["kv"] + 3 * s["h"] * s["i"]
    n = s["layers"] * per_layer + s["vocab"] * s["h"]
    attention = s["layers"] * 3.5 * 2 * seq * q  # causal: half of 4*seq*q forward
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
                # The batch-1 search's per-length lines carry only the mode ("8b-qlora-ctx").
                four_bit = raw.get("load_in_4bit") or "qlora" in raw.get("mode", "")
                who = ("unsloth QLoRA (" if four_bit else "unsloth (") + (
                    "no checkpointing" if "nogc" in raw.get("mode", "") else "offload checkpointing") + ")"
            else:
                who = raw.get("who", who)
            r = {"shape": r["shape"], "who": who, "ok": raw.get("ok", "error" not in raw),
                 "batch": r.get("batch", raw.get("B")), "seq": r.get("seq", raw.get("S")),
                 "tok_s": raw.get("tok_s"), "peak_GiB": raw.get("peak_GiB"), "error": raw.get("error")}
        out.append(r)
    return out


def checkpointed(who):
    return any(k in who for k in ("recompute", "offload", "gradient checkpointing", "gc=True"))


def qlora(who):
    return any(k in who for k in ("--qlora", "bnb", "QLoRA"))


def peer(rs, prefixes, ckpt):
    """The first successful run whose name starts with one of prefixes, with the same checkpointing."""
    for p in prefixes:
        for r in rs:
            if r.get("ok") and r["who"].startswith(p) and checkpointed(r["who"]) == ckpt:
                return r
    return None


def main():
    data = rows(sys.argv[1])
    for shape in SHAPES:
        every = [r for r in data if r.get("shape") == shape]
        rs = [r for r in every if r.get("batch") != 1]  # batch 1: the longest-sequence search, below
        ctx = [r for r in every if r.get("batch") == 1]
        if not rs:
            ctx_table(shape, ctx)
            continue
        fpt = flops_per_token(shape, SHAPES[shape]["seq"])
        # bitsandbytes' lines carry no batch of their own: the shape's, as run.sh runs it
        print(f"\n### {shape} shape, batch {SHAPES[shape]['batch']} x 2048, LoRA r16 on every projection, bf16\n")
        print("Ratios are tokens/s at peak memory against the peer with the same checkpointing and base weights.\n")
        print("| run | tokens/s | peak GPU GiB | MFU | vs PEFT | vs Unsloth |")
        print("|---|---|---|---|---|---|")
        for r in rs:
            if not r.get("ok"):
                print(f"| {r['who']} | failed: {r.get('error', '')} | | | | |")
                continue
            t, who = r["tok_s"], r["who"]
            ck, q = checkpointed(who), qlora(who)
            base = peer(rs, ["peft+bnb"] if q else ["transformers+peft (sdpa)"], ck)
            uns = peer(rs, ["unsloth QLoRA", "unsloth ("] if q else ["unsloth ("], ck)

            def ratio(b):
                if not b or b is r or not b.get("tok_s"):
                    return "—"
                out = f"{t / b['tok_s']:.2f}x"
                if r.get("peak_GiB") and b.get("peak_GiB"):
                    out += f" at {r['peak_GiB'] / b['peak_GiB']:.2f}x mem"
                if q and not qlora(b["who"]):
                    out += " (bf16 base)"
                return out
            host = f" (+{r['host_GiB']} host)" if r.get("host_GiB") else ""
            print(f"| {who} | {t:,.0f} | {r['peak_GiB']}{host} | {100 * t * fpt / PEAK:.1f}% | {ratio(base)} | {ratio(uns)} |")
        ctx_table(shape, ctx)


def ctx_table(shape, ctx):
    """Per run, the longest batch-1 sequence that trained and the first one that did not."""
    if not ctx:
        return
    print(f"\n### {shape} shape, batch 1, the longest sequence that trains\n")
    print("| run | longest that trained | peak GPU GiB | tokens/s there | first that failed |")
    print("|---|---|---|---|---|")
    for who in dict.fromkeys(r["who"] for r in ctx):
        tried = sorted((r for r in ctx if r["who"] == who), key=lambda r: r.get("seq") or 0)
        ok = [r for r in tried if r.get("ok")]
        bad = [r for r in tried if not r.get("ok")]
        best = ok[-1] if ok else None
        fail = f"{bad[0].get('seq')}: {(bad[0].get('error') or '')[:120]}" if bad else "— (none tried)"
        host = f" (+{best['host_GiB']} host)" if best and best.get("host_GiB") else ""
        print(f"| {who} | {best['seq'] if best else 'none'} | {str(best['peak_GiB']) + host if best else ''} | "
              f"{best['tok_s'] if best else ''} | {fail} |")


if __name__ == "__main__":
    main()
