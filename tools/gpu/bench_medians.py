#!/usr/bin/env python3
"""Medians of loom_bench runs (Google Benchmark JSON) by build: tools/gpu/ab.sh and ab_variants.sh.

  tools/gpu/bench_medians.py DIR NAME [NAME ...]
reads DIR/<NAME>-<round>.json for each build NAME and prints each benchmark's median real time per
build and its ratio to the first build's. ab.sh imports real_times() for its before/after table.
"""
import glob
import json
import statistics
import sys


def real_times(paths_of):
    """{benchmark: {build: [(real_time, time_unit), ...]}} over the JSON files paths_of maps each build to."""
    times = {}
    for build, paths in paths_of.items():
        for f in sorted(paths):
            try:
                runs = json.load(open(f))["benchmarks"]
            except (OSError, ValueError, KeyError):
                continue
            for b in runs:
                if b.get("run_type", "iteration") == "iteration" and "real_time" in b:
                    times.setdefault(b["name"], {}).setdefault(build, []).append((b["real_time"], b.get("time_unit", "ns")))
    return times


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, names = sys.argv[1], sys.argv[2:]
    times = real_times({n: glob.glob(f"{out}/{n}-*.json") for n in names})
    head = f"benchmark (median real time; ratio to {names[0]})"
    print(f"{head:64}" + "".join(f"{n:>16}" for n in names))
    for name, t in times.items():
        base = statistics.median(x for x, _ in t[names[0]]) if names[0] in t else None
        row = f"{name:64}"
        for n in names:
            if n not in t:
                row += f"{'-':>16}"
                continue
            m = statistics.median(x for x, _ in t[n])
            row += f"{m:9.1f}" + (f" {m / base:5.3f}" if base else "      ")
        print(row)


if __name__ == "__main__":
    main()
