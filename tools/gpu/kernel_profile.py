#!/usr/bin/env python3
"""Where a GPU run's time goes, kernel by kernel: reads the CSV that
`ncu --csv --metrics gpu__time_duration.sum` printed (tools/gpu/kernel_profile.sh writes it) and prints
each kernel's total time, launch count and share, largest first, then the total.

    tools/gpu/kernel_profile.py ncu.csv [--steps N] [--top 40]

--steps divides the totals by the number of training steps the run took (per-step figures);
--skip-steps N leaves out every launch up to the end of the N-th step's optimizer kernels (the load,
NF4 quantisation and first-step warm-up), so that --steps then counts the steps that remain.
Kernel names are shortened to the function name with its template arguments cut at 60 characters:
cuBLASLt's nvjet kernels keep their tile-shape names, which tell the GEMMs apart. A second table
sums the kernels by kind (KINDS: attention, GEMMs, the experts' grouped GEMMs, the LM head's loss,
norms, MoE routing, elementwise and copies, the optimizer, initialisation and quantisation), so
that a step's time can be taken apart before choosing what to speed up."""
import argparse
import csv
import re
import sys
from collections import defaultdict

UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}  # -> microseconds


def short(name):
    name = re.sub(r"\(anonymous namespace\)::|\bloom::cuda::|\bloom::", "", name.strip())
    if name.endswith(")"):  # drop the parameter list: the parenthesis that closes at the end
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"^(void|static)\s+", "", name)
    return name if len(name) <= 60 else name[:57] + "..."


# A kernel's kind: the first pattern its short name matches (re.search), else "other".
KINDS = [
    ("attention", r"flash|attention|dsum_kernel|dq_finish"),
    ("grouped GEMM (experts)", r"grouped_gemm|write_problems|write_pointers"),
    ("GEMM (cuBLAS / cuBLASLt)", r"nvjet|gemm|cutlass|xmma|cublas"),
    ("LM head loss", r"row_kernel|cross_entropy|lce_"),
    ("norms", r"rms_|norm_kernel"),
    ("MoE routing / dispatch / combine", r"route_|dispatch|combine_|count_experts|aux_loss|moe_"),
    ("optimizer", r"adam|sgd|lion|grad_norm"),
    ("init / quantise (load)", r"normal_kernel|uniform_kernel|nf4_quantize|nf4_mean|nf4_double_quantize"),
    ("dequantise (NF4)", r"nf4_dequant"),
    ("elementwise / activation / rope", r"map_kernel|gated_|rope_|scale_kernel|dropout"),
    ("copies / casts / embedding", r"copy|cast_kernel|transpose|embedding|split_kernel|memcpy|memset"),
    ("reductions", r"reduce|block_sum"),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def step_ends(launches, gap=4):
    """Index of each step's last optimizer launch: the end of a run of optimizer kernels that no other
    optimizer launch follows within `gap` launches (the clip's scale may sit between them)."""
    ends, last = [], None
    for i, (name, _) in enumerate(launches):
        if kind_of(name) == "optimizer":
            last = i
        elif last is not None and i - last > gap:
            ends.append(last)
            last = None
    if last is not None:
        ends.append(last)
    return ends


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--skip-steps", type=int, default=0)
    a = ap.parse_args()
    total = defaultdict(float)
    count = defaultdict(int)
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages (==PROF== ...) are not CSV
    launches = []  # (short name, microseconds) in launch order
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        launches.append((short(row["Kernel Name"]), value * UNITS.get(row.get("Metric Unit", "nsecond"), 1e-3)))
    ends = step_ends(launches)
    if a.skip_steps:
        if len(ends) < a.skip_steps:
            sys.exit(f"{a.csv}: {len(ends)} optimizer steps found, fewer than --skip-steps {a.skip_steps}")
        launches = launches[ends[a.skip_steps - 1] + 1:]
        print(f"(left out: every launch up to the end of step {a.skip_steps}'s optimizer; "
              f"{len(ends)} steps found in all)")
    for k, us in launches:
        total[k] += us
        count[k] += 1
    if not total:
        sys.exit(f"{a.csv}: no gpu__time_duration.sum rows (did ncu profile any kernel?)")
    grand = sum(total.values())
    s = a.steps
    print(f"{'kernel':62} {'ms/step':>9} {'launches/step':>14} {'us/launch':>10} {'share':>6}")
    for k, us in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{k:62} {us / s / 1e3:9.2f} {count[k] / s:14.1f} {us / count[k]:10.1f} {100 * us / grand:5.1f}%")
    print(f"{'total (' + str(sum(count.values()) // s) + ' launches per step)':62} {grand / s / 1e3:9.2f}")
    by_kind, kind_count = defaultdict(float), defaultdict(int)
    for k, us in total.items():
        by_kind[kind_of(k)] += us
        kind_count[kind_of(k)] += count[k]
    print()
    print(f"{'kind':62} {'ms/step':>9} {'launches/step':>14} {'':>10} {'share':>6}")
    for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"{kind:62} {us / s / 1e3:9.2f} {kind_count[kind] / s:14.1f} {'':>10} {100 * us / grand:5.1f}%")


if __name__ == "__main__":
    main()
