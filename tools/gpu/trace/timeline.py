#!/usr/bin/env python3
"""Reads a CUPTI timeline (tools/gpu/trace/cupti_trace.cpp) and says where a training step's wall time
went on the device: time with some kernel or copy running, and the gaps between them, each gap
called "host" when the API call that launched the next piece of work started after the device had
gone idle (the device waited for the host to queue it) and "device" otherwise (launch latency, a
wait on another stream). Steps are found by a kernel launched once a step (--step-kernel).
  python3 tools/gpu/trace/timeline.py trace.csv [--step-kernel embedding_forward] [--last 3]
  ... --show rms_forward 2 4   the last step's work, one line each (start, duration, grid, name),
                               from the 2nd to the 4th launch of a kernel named like rms_forward
                               (one decoder layer's forward; rms_backward for its backward)"""
import argparse
import collections
import csv
import gzip
import re
import sys


def short(name, n=60):
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"\(.*$", "", name)  # drop the parameter list
    return name[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--step-kernel", default="embedding_forward")
    ap.add_argument("--last", type=int, default=3, help="steps to report (the last complete ones)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--show", nargs=3, metavar=("KERNEL", "FROM", "TO"),
                    help="list the last step's work between two launches of a kernel")
    a = ap.parse_args()
    opener = gzip.open if a.trace.endswith(".gz") else open
    work, api = [], {}
    with opener(a.trace, "rt") as f:
        for r in csv.DictReader(f):
            s, e = int(r["start_ns"]), int(r["end_ns"])
            if r["what"] in ("kernel", "memcpy", "memset"):
                name = r["name"] if r["what"] == "kernel" else f'{r["what"]} {r["name"]} {r["extra"]} B'
                work.append((s, e, int(r["stream_or_thread"]), int(r["correlation"]), name, r["extra"]))
            elif r["what"] in ("runtime", "driver"):
                c = int(r["correlation"])
                # a runtime launch and the driver call inside it: keep the outer (earlier) start
                if c not in api or s < api[c][0]:
                    api[c] = (s, e, r["name"])
    work.sort()
    marks = [w[0] for w in work if a.step_kernel in w[4]]
    if len(marks) < 2:
        sys.exit(f"timeline: fewer than two launches of a kernel named like '{a.step_kernel}'")
    steps = list(zip(marks[:-1], marks[1:]))[-a.last:]
    print(f"{len(work)} device records, {len(api)} API records, {len(marks)} step marks; "
          f"reporting the last {len(steps)} complete steps")
    tot = collections.Counter()
    kern = collections.Counter()
    kcount = collections.Counter()
    gap_by = {"host": collections.Counter(), "device": collections.Counter()}
    gap_n = {"host": collections.Counter(), "device": collections.Counter()}
    streams = collections.Counter()
    for t0, t1 in steps:
        items = [w for w in work if t0 <= w[0] < t1]
        wall = t1 - t0
        busy, end, prev = 0, t0, None
        for s, e, stream, corr, name, _ in items:
            kern[short(name)] += e - s
            kcount[short(name)] += 1
            streams[stream] += e - s
            if s > end:
                gap = s - end
                launch = api.get(corr)
                kind = "host" if launch is not None and launch[0] >= end else "device"
                key = f"{short(prev or 'step start', 40)} -> {short(name, 40)}"
                gap_by[kind][key] += gap
                gap_n[kind][key] += 1
                tot[kind] += gap
            if e > end:
                busy += e - max(s, end)
                end, prev = e, name
        tot["wall"] += wall
        tot["busy"] += busy
        tot["tail"] += max(0, t1 - end)
        print(f"step [{(t0 - steps[0][0]) / 1e6:9.2f} ms]: wall {wall / 1e6:8.2f} ms, device busy {busy / 1e6:8.2f}, "
              f"{len(items)} launches")
    n = len(steps)
    ms = lambda v: v / 1e6 / n
    print(f"\nper step (mean of {n}): wall {ms(tot['wall']):.2f} ms | something running {ms(tot['busy']):.2f} "
          f"| gaps the host caused {ms(tot['host']):.2f} | other gaps {ms(tot['device']):.2f} "
          f"| idle at the step's end {ms(tot['tail']):.2f}")
    print("\nkernels, real durations in the run (ms/step, launches/step, us/launch):")
    for k, v in kern.most_common(a.top):
        print(f"  {ms(v):8.3f} {kcount[k] / n:7.1f} {v / kcount[k] / 1e3:9.1f}  {k}")
    print("\nstreams (ms/step of work):", ", ".join(f"{s}: {ms(v):.2f}" for s, v in streams.most_common()))
    for kind in ("host", "device"):
        print(f"\ngaps ({kind}), largest sums: ms/step, count/step, us each, previous -> next")
        for k, v in gap_by[kind].most_common(a.top):
            print(f"  {ms(v):8.3f} {gap_n[kind][k] / n:7.1f} {v / gap_n[kind][k] / 1e3:8.1f}  {k}")
    if a.show:
        pattern, first, last = a.show[0], int(a.show[1]), int(a.show[2])
        t0, t1 = steps[-1]
        items = [w for w in work if t0 <= w[0] < t1]
        at = [i for i, w in enumerate(items) if pattern in w[4]]
        if len(at) < max(first, last):
            sys.exit(f"timeline: the last step has {len(at)} launches like '{pattern}'")
        print(f"\nthe last step from launch {first} to {last} of '{pattern}': start (us from the step's), us, grid, name")
        for s, e, _, _, name, extra in items[at[first - 1]:at[last - 1] + 1]:
            print(f"  {(s - t0) / 1e3:10.1f} {(e - s) / 1e3:8.1f} {extra:>7}  {short(name, 70)}")
    # The host's API time a step, by call.
    calls = collections.Counter()
    ncalls = collections.Counter()
    lo, hi = steps[0][0], steps[-1][1]
    for s, e, name in api.values():
        if lo <= s < hi:
            calls[name] += e - s
            ncalls[name] += 1
    print("\nhost API calls (ms/step inside the calls, calls/step):")
    for k, v in calls.most_common(15):
        print(f"  {ms(v):8.3f} {ncalls[k] / n:8.1f}  {k}")


if __name__ == "__main__":
    main()
