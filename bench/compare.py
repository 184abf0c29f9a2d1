#!/usr/bin/env python3
"""Prints one table from loom_bench's Google Benchmark JSON and (optionally) peer_torch.py's JSON:
name, Loom time per launch, PyTorch time, speed-up (torch time / Loom time: above 1 means Loom is
faster), Loom's achieved GB/s or TFLOP/s and its % of the roofline measured at loom_bench start-up,
and, for cases that measure it, the device memory each side took (Loom's peak_GiB or device_GiB
counter, PyTorch's peak_bytes; each case's peer says what its figure covers).

    python3 bench/compare.py OUTDIR/bench.json [OUTDIR/torch.json] [--markdown]

Loom's time is the median aggregate when loom_bench ran with --benchmark_repetitions, else the
mean of its one run; PyTorch's is the median over batches. A case PyTorch ran in several variants
(e.g. AdamW forloop / foreach / fused) gets one row per variant.
"""
import argparse
import json
import sys

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def base_name(name):
    for suffix in ("/manual_time", "/real_time"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def load_loom(path):
    """{name: entry} with entry = dict(time_s, bytes_ps, flops_ps, pct, bound, error), in file order."""
    with open(path) as f:
        doc = json.load(f)
    plain, medians = {}, {}
    for b in doc.get("benchmarks", []):
        name = base_name(b.get("run_name", b["name"]))
        entry = {"error": b.get("error_message") if b.get("error_occurred") else None}
        if not entry["error"]:
            entry.update(
                time_s=float(b["real_time"]) * _UNIT_S.get(b.get("time_unit", "ns"), 1e-9),
                bytes_ps=b.get("bytes_per_second"),
                flops_ps=b.get("flops_per_second"),
                pct=b.get("pct_of_roofline"),
                bound=b.get("label", ""),
                mem_gib=b.get("peak_GiB", b.get("device_GiB")),
            )
        run_type = b.get("run_type", "iteration")
        if run_type == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = entry
        elif name not in plain:  # with repetitions, keep the first run (the median replaces it)
            plain[name] = entry
    merged = dict(plain)
    merged.update(medians)
    return merged, doc.get("context", {})


def load_torch(path):
    """{name: [entry, ...]} with entry = dict(variant, time_s, error)."""
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for b in doc.get("benchmarks", []):
        e = {"variant": b.get("variant", ""), "error": b.get("error")}
        if not e["error"]:
            e["time_s"] = float(b["median_s"])
            if "peak_bytes" in b:
                e["mem_gib"] = float(b["peak_bytes"]) / 2**30
        out.setdefault(b["name"], []).append(e)
    return out, doc.get("context", {})


def fmt_time(s):
    if s is None:
        return "-"
    if s >= 1.0:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def achieved(e):
    if e.get("bound") == "gemm" and e.get("flops_ps"):
        return f"{e['flops_ps'] * 1e-12:.1f} TFLOP/s"
    if e.get("bytes_ps"):
        return f"{e['bytes_ps'] * 1e-9:.0f} GB/s"
    if e.get("flops_ps"):
        return f"{e['flops_ps'] * 1e-12:.1f} TFLOP/s"
    return "-"


def fmt_mem(e):
    return f"{e['mem_gib']:.2f} GiB" if (e and e.get("mem_gib") is not None and not e.get("error")) else "-"


def build_rows(loom, torch_res):
    rows = []
    names = list(loom) + [n for n in torch_res if n not in loom]
    for name in names:
        le = loom.get(name)
        peers = torch_res.get(name) or [None]
        for te in peers:
            variant = te["variant"] if te else ""
            l_time = le.get("time_s") if le else None
            t_time = te.get("time_s") if te else None
            if le and le.get("error"):
                l_col = "ERROR"
            else:
                l_col = fmt_time(l_time) if le else "-"
            if te and te.get("error"):
                t_col = "ERROR"
            else:
                t_col = fmt_time(t_time)
            ratio = f"{t_time / l_time:.2f}x" if (l_time and t_time) else "-"
            ach = achieved(le) if (le and not le.get("error")) else "-"
            pct = f"{le['pct']:.1f}%" if (le and le.get("pct") is not None and not le.get("error")) else "-"
            rows.append([name, variant, l_col, t_col, ratio, ach, pct, fmt_mem(le), fmt_mem(te)])
    return rows


def render(rows, markdown):
    header = ["benchmark", "torch variant", "loom", "torch", "torch/loom", "loom achieved", "% roofline", "loom mem",
              "torch mem"]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    right = {2, 3, 4, 5, 6, 7, 8}

    def line(r):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("loom_json")
    ap.add_argument("torch_json", nargs="?")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    loom, lctx = load_loom(args.loom_json)
    torch_res, tctx = load_torch(args.torch_json) if args.torch_json else ({}, {})
    print(f"GPU: {lctx.get('gpu', '?')}   roofline: copy {lctx.get('roofline_copy_GBps', '?')} GB/s (read + write), "
          f"bf16 GEMM {lctx.get('roofline_gemm_bf16_TFLOPs', '?')} TFLOP/s")
    if tctx:
        print(f"PyTorch {tctx.get('torch', '?')} (CUDA {tctx.get('cuda', '?')}) on {tctx.get('gpu', '?')}")
    print("torch/loom > 1: Loom is faster. % roofline: memory-bound vs copy bandwidth, GEMM/attention vs GEMM rate.")
    rows = build_rows(loom, torch_res)
    if not rows:
        print("no benchmarks found", file=sys.stderr)
        return 1
    print(render(rows, args.markdown))
    errors = [(n, e["error"]) for n, e in loom.items() if e.get("error")]
    for name, msg in errors:
        print(f"loom ERROR {name}: {msg}")
    for name, entries in torch_res.items():
        for e in entries:
            if e.get("error"):
                print(f"torch ERROR {name} [{e['variant']}]: {e['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
