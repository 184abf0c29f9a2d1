#!/usr/bin/env python3
"""Turns tools/gpu/gpu_dist_bench.sh's JSON lines into the data-parallel scoreboard: per system and world
size, global tokens/s, scaling efficiency (N-GPU tokens/s over N x the same system's one-GPU tokens/s),
peak memory per GPU, Loom's optimizer state + f32 masters per rank, then the comparisons the
multi-GPU issue asks for: ZeRO-2 against FSDP2 (tokens/s at per-GPU memory) and every Loom run's
per-step losses against one process that trains the same global batch.

  python3 bench/dist_table.py dist_bench.txt
"""
import json
import sys


def load(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def name(r):
    return r.get("loom") or r.get("peer")


def gib(b):
    return f"{b / 2**30:.2f}" if b is not None else ""


def main():
    rows = load(sys.argv[1])
    runs = [r for r in rows if not r.get("reference")]
    refs = [r for r in rows if r.get("reference")]
    one = {(name(r), r.get("tag", "")): r for r in runs if r["world"] == 1}
    print("| system | GPUs | tokens/s | scaling | peak GPU GiB (rank 0) | optimizer + masters MiB/rank |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        base = one.get((name(r), r.get("tag", "")))
        scaling = ""
        if base and r["world"] > 1:
            scaling = f"{100 * r['tokens_per_s'] / (r['world'] * base['tokens_per_s']):.1f}%"
        mem = r.get("peak_mem_bytes_rank0", r.get("peak_mem_bytes"))
        opt = r.get("optimizer_mib_per_rank")
        print(f"| {name(r)} | {r['world']} | {r['tokens_per_s']:,.0f} | {scaling} | {gib(mem)} | "
              f"{'' if opt is None else f'{opt:,.1f}'} |")

    by_world = {}
    for r in runs:
        by_world.setdefault(r["world"], []).append(r)
    for world, rs in sorted(by_world.items()):
        zero2 = next((r for r in rs if r.get("loom") and "--dist zero2" in r["loom"] and "--full" in r["loom"]), None)
        fsdp2 = next((r for r in rs if r.get("peer", "").startswith("torch fsdp2")), None)
        if zero2 and fsdp2:
            print(f"\n{world} GPU(s): loom --dist zero2 {zero2['tokens_per_s'] / fsdp2['tokens_per_s']:.2f}x FSDP2's "
                  f"tokens/s at {zero2['peak_mem_bytes_rank0'] / fsdp2['peak_mem_bytes']:.2f}x its memory per GPU")
    for ref in refs:
        for r in runs:
            if not r.get("losses") or r.get("tag", "") != ref.get("tag", "") or r["world"] != ref["world_of"]:
                continue
            n = min(len(r["losses"]), len(ref["losses"]))
            worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"][:n], ref["losses"][:n]))
            print(f"\n{name(r)} on {r['world']} GPUs against one process with the global batch "
                  f"({ref['loom']}): {n} steps, largest relative loss difference {worst:.2e}")


if __name__ == "__main__":
    main()
