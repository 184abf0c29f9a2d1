#!/usr/bin/env python3
"""Where a kernel's warps waited: Nsight Compute's per-instruction warp-state samples, summed.

Reads the SASS source page of one profiled kernel as CSV (on the GPU machine:
  ncu --set full --import-source no -k regex:KERNEL -c 1 -o /tmp/k <program> ...
  ncu -i /tmp/k.ncu-rep --page source --print-source sass --csv > k.csv)
and prints the samples by stall reason over the whole kernel, then the instructions that drew the
most samples with their two largest reasons. Addresses are offsets from the kernel's first
instruction, so that two builds of the same source line up.
  tools/gpu/ncu_stalls.py k.csv [--top 40] [--title TEXT]     (k.csv may be xz-compressed: k.csv.xz)
"""
import argparse
import csv
import io
import lzma
import sys


def rows_of(path):
    raw = lzma.open(path, "rt") if path.endswith(".xz") else open(path, newline="")
    with raw:
        lines = raw.read().splitlines()
    # The page starts with a "Kernel Name" line, then the header of the instruction table.
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        sys.exit(f"ncu_stalls: {path}: no \"Address\" header (not an ncu --page source --csv export?)")
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def number(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    rows = rows_of(args.csv)
    reasons = [k for k in rows[0] if k.startswith("stall_") and not k.endswith("(Not Issued)")]
    sample_key = "Warp Stall Sampling (All Samples)"
    if sample_key not in rows[0]:
        sys.exit(f"ncu_stalls: {args.csv}: no \"{sample_key}\" column")
    base = int(rows[0]["Address"], 16)
    total = sum(number(r[sample_key]) for r in rows)
    if total == 0:
        sys.exit(f"ncu_stalls: {args.csv}: no warp-state samples")
    if args.title:
        print(args.title)
    print(f"warp-state samples by instruction (ncu source page), {total} samples")
    print("by stall reason:")
    by_reason = {r: sum(number(row[r]) for row in rows) for r in reasons}
    for r, n in sorted(by_reason.items(), key=lambda kv: -kv[1]):
        if n * 200 >= total:  # 0.5 % and more
            print(f"  {r:28} {n:8d} {100 * n / total:5.1f}%")
    print(f"top {args.top} instructions (offset, samples, share, two largest reasons):")
    for row in sorted(rows, key=lambda r: -number(r[sample_key]))[: args.top]:
        n = number(row[sample_key])
        two = sorted(((number(row[r]), r) for r in reasons), reverse=True)[:2]
        why = " ".join(f"{r[len('stall_'):]}={c}" for c, r in two if c)
        offset = int(row["Address"], 16) - base
        print(f"  {offset:6x} {n:6d} {100 * n / total:5.1f}%  {row['Source'].strip()[:58]:58} {why}")


if __name__ == "__main__":
    main()
