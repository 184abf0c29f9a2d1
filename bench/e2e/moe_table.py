#!/usr/bin/env python3
"""Turns bench/e2e/moe.sh's JSON lines into the mixture-of-experts table: per shape (and layer count), each
run's tokens/s, peak GPU memory (the framework's own count: Loom's allocator peak, with its CUDA pool's
reservation where larger, torch.cuda.max_memory_allocated for the peers; and nvidia-smi's peak of used memory, the
same measure for all), MFU over the active parameters,
the ratios like for like, and the issue's contract (Loom >= 2x transformers and >= 1x Unsloth at no more memory).

MFU, two ways:
  - "MFU": the dense scoreboard's count (bench/e2e/table.py): LoRA training does forward 2N + input-gradient 2N
    FLOPs a token over the active linears (attention, router, the top-k experts, lm_head once; the embedding is
    a lookup), plus causal attention at 3.5 x 2 x seq x q_width a layer; against 989 TFLOP/s (H200 dense bf16).
  - "MFU 6N": 6 x active parameters a token (as if the weight gradients were computed too) plus the same
    attention, against 795 TFLOP/s (the issue's figure).
Recomputation is counted in neither.

    python3 bench/e2e/moe_table.py moe.jsonl
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_model  # noqa: E402

PEAK, PEAK_6N = 989e12, 795e12
TARGET = {"transformers": 2.0, "unsloth": 1.0}


def flops_per_token(shape, layers, seq):
    i = moe_model.info(shape, layers)
    attention = i["layers"] * 3.5 * 2 * seq * i["q_width"]
    return 4 * i["active_params"] + attention, 6 * i["active_params"] + attention


def count(n):
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def gib(x):
    return f"{x} GiB" if x else "? GiB"


def load(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def mem(r):
    """The run's peak for comparisons: nvidia-smi's where the run has it, else its framework's."""
    return r.get("smi_GiB") or r.get("peak_GiB")


def peer_for(rs, r, kind):
    """The like-for-like peer of a Loom run: same base weights (bf16 / NF4) and checkpointing or not (Loom's
    recompute and offload both against the peer's checkpointing: transformers keeps each layer's input on the
    GPU as recompute does, Unsloth's "unsloth" moves it to host memory as offload does). Unsloth's QLoRA
    falls back to its bf16 run (marked) where there is none."""
    same = [p for p in rs if p.get("ok") and p.get("peer") == kind and p.get("gc") == r["gc"] and p.get("tok_s")]
    for p in same:
        if p.get("base") == r["base"]:
            return p, False
    if kind == "unsloth":
        for p in same:
            return p, True
    return None, False


def ratio(r, p, other_base):
    if not p:
        return "—"
    s = f"{r['tok_s'] / p['tok_s']:.2f}x"
    if mem(r) and mem(p):
        s += f" at {mem(r) / mem(p):.2f}x mem"
    return s + (" (bf16 base)" if other_base else "")


def contract(rs):
    """Per peer run: the fastest Loom run of the same base weights whose peak is no larger, and its speed ratio."""
    lines = []
    looms = [r for r in rs if r.get("peer") == "loom" and r.get("ok")]
    for kind in ("transformers", "unsloth"):
        peers = [p for p in rs if p.get("peer") == kind and p.get("ok") and p.get("tok_s")]
        if not peers:
            lines.append(f"- vs {kind}: no successful peer run")
            continue
        worst = None
        for p in peers:
            fit = [r for r in looms if r["base"] == p["base"] and mem(r) and mem(p) and mem(r) <= mem(p)]
            if not fit:
                lines.append(f"- vs {p['who']} ({p['tok_s']:,.0f} tok/s, {gib(mem(p))}): no Loom {p['base']} run at "
                             f"<= its memory")
                worst = 0.0
                continue
            best = max(fit, key=lambda r: r["tok_s"])
            x = best["tok_s"] / p["tok_s"]
            worst = x if worst is None else min(worst, x)
            lines.append(f"- vs {p['who']} ({p['tok_s']:,.0f} tok/s, {gib(mem(p))}): {best['who']} "
                         f"{best['tok_s']:,.0f} tok/s at {gib(mem(best))} = **{x:.2f}x**")
        ok = worst is not None and worst >= TARGET[kind]
        why = (f"the worst of these {worst:.2f}x" if worst else "a peer run has no Loom run of its base weights at "
               "no more memory")
        lines.append(f"- **{kind}: {'met' if ok else 'NOT met'}** ({why}; target >= {TARGET[kind]:.1f}x)")
    return lines


def main():
    data = load(sys.argv[1])
    groups, latest = {}, {}
    for r in data:
        if r.get("shape") in moe_model.SHAPES:
            # A line without its layer count (an error line) goes with the shape's latest group.
            layers = r.get("layers") or latest.get(r["shape"]) or moe_model.info(r["shape"])["layers"]
            latest[r["shape"]] = layers
            groups.setdefault((r["shape"], layers), []).append(r)
    for (shape, layers), every in groups.items():
        i = moe_model.info(shape, layers)
        probes = [r for r in every if r.get("mode") == "probe"]
        rs = [r for r in every if r.get("mode") != "probe"]
        seq = next((r["seq"] for r in rs if r.get("seq")), 2048)
        batch = next((r["batch"] for r in rs if r.get("batch")), "?")
        f4, f6 = flops_per_token(shape, layers, seq)
        print(f"\n### {i['title']} shape ({shape}): {layers} of {i['full_layers']} layers ran, batch {batch} x {seq}, "
              f"LoRA r16 on q/k/v/o and the experts, bf16\n")
        print(f"{i['experts']} experts, top {i['top_k']}, hidden {i['hidden']}, expert width {i['expert_width']}; "
              f"{count(i['total_params'])} parameters in these layers, {count(i['active_params'])} active a token. Peak: the framework's own count (Loom's allocator, torch.cuda.max_memory_allocated); smi: "
              f"nvidia-smi's peak of used memory over the run, load included (the ratios use it where both have it). "
              f"Ratios: tokens/s at memory against the peer with the same checkpointing and base weights.\n")
        print("| run | tokens/s | peak GiB | smi GiB | MFU | MFU 6N | vs transformers | vs Unsloth |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rs:
            if not r.get("ok"):
                print(f"| {r.get('who', r.get('mode'))} | failed: {(r.get('error') or '')[:200]} | | | | | | |")
                continue
            t = r["tok_s"]
            vs = ["—", "—"]
            if r.get("peer") == "loom":
                for k, kind in enumerate(("transformers", "unsloth")):
                    p, other = peer_for(rs, r, kind)
                    vs[k] = ratio(r, p, other)
            # Loom's CUDA pool reservation (metrics.jsonl's mem_reserved_bytes) where it holds more than
            # is in use: the gap between the peak and nvidia-smi's figure that is fragmentation.
            extra = [f"pool {r['reserved_GiB']}"] if r.get("reserved_GiB") and r["reserved_GiB"] > r.get("peak_GiB", 0) else []
            extra += [f"+{r['host_GiB']} host"] if r.get("host_GiB") else []
            peak = r["peak_GiB"] if r.get("peak_GiB") is not None else "—"
            peak = f"{peak} ({', '.join(extra)})" if extra else f"{peak}"
            print(f"| {r['who']} | {t:,.0f} | {peak} | {r.get('smi_GiB', '—')} | {100 * t * f4 / PEAK:.1f}% | "
                  f"{100 * t * f6 / PEAK_6N:.1f}% | {vs[0]} | {vs[1]} |")
        print("\nContract (issue 33: Loom >= 2x transformers and >= 1.0x Unsloth at no more memory):\n")
        for line in contract(rs):
            print(line)
        notes = []
        for p in probes:
            if p.get("ok"):
                ms = ", ".join(f"{k} {v} ms" for k, v in sorted(p["ms"].items(), key=lambda kv: kv[1]))
                errs = "; ".join(f"{k}: {v[:80]}" for k, v in p.get("errors", {}).items())
                notes.append(f"- transformers' experts implementations, one MoE block forward + backward at "
                             f"{p.get('tokens')} tokens: {ms} -> **{p['best']}** for the transformers runs"
                             + (f" (not run: {errs})" if errs else ""))
            else:
                notes.append(f"- experts probe failed: {(p.get('error') or '')[:200]}")
        for r in rs:
            if r.get("ok") and r.get("quantised"):
                q = r["quantised"]
                notes.append(f"- {r['who']}: 4-bit {q['4bit_GiB']} GiB in {q['4bit_tensors']} tensors "
                             f"({q['linear4bit_modules']} Linear4bit), 16-bit {q['16bit_GiB']} GiB; expert tensors "
                             f"4-bit {q['experts_4bit']}, 16-bit {q['experts_16bit']}"
                             + (f"; base {r['source']}" if r.get("source") else ""))
            if r.get("ok") and r.get("peer") == "unsloth" and "unsloth_moe_backend" in r:
                notes.append(f"- {r['who']}: MoE backend {r.get('unsloth_moe_backend')}, experts implementation "
                             f"{r.get('experts_impl')}, target_parameters {r.get('target_parameters')}, "
                             f"{r.get('expert_lora_params', 0):,} expert LoRA parameters")
            if r.get("ok") and r.get("peer") == "transformers" and r.get("expert_lora_params") is not None \
                    and not r.get("quantised"):
                notes.append(f"- {r['who']}: {r.get('trainable_params', 0):,} trainable, "
                             f"{r['expert_lora_params']:,} in the experts; router trainable: "
                             f"{r.get('router_trainable')}; base {r.get('source', 'folder')}")
        if notes:
            print("\nNotes:\n")
            print("\n".join(notes))


if __name__ == "__main__":
    main()
