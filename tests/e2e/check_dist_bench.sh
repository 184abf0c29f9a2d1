#!/usr/bin/env bash
# CTest e2e_dist_bench_cpu (label mpi): tools/gpu/gpu_dist_bench.sh, the multi-GPU scoreboard, run on CPU
# processes (LOOM_DIST_DEVICE=cpu, a small random model, no PyTorch peers) for worlds of 1 and 2, so
# that the script and bench/dist_table.py cannot rot while no multi-GPU machine runs them. Checks
# what the table reports: both modes' losses on 2 ranks against one process with the global batch
# (within 1e-5 relative, the MPI tests' tolerance), ZeRO-2's optimizer + masters per rank halved on 2
# ranks while DDP's stays whole, and a scaling figure for each mode.
set -euo pipefail
loom=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$loom" init --from "$src/examples/demo/model-config" --out "$tmp/model" --seed 0 > /dev/null
cd "$src"
LOOM_DIST_DEVICE=cpu LOOM_DIST_MODEL="$tmp/model" LOOM_DIST_PEERS=" " LOOM_DIST_SEQ=64 LOOM_DIST_BATCH=2 \
  LOOM_DIST_DTYPE=f32 LOOM_DIST_STEPS=6 LOOM_BIN="$loom" OUT="$tmp/out" tools/gpu/gpu_dist_bench.sh 2 > "$tmp/log" 2>&1 ||
  { cat "$tmp/log"; exit 1; }
cat "$tmp/out/dist_table.md"
python3 - "$tmp/out/dist_bench.txt" "$tmp/out/dist_table.md" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
table = open(sys.argv[2]).read()
def run(mode, world):
    return next(r for r in rows if not r.get("reference") and r["loom"].endswith("--dist " + mode) and r["world"] == world)
bad = []
for mode in ("ddp", "zero2"):
    if len(run(mode, 2)["losses"]) != 6:
        bad.append(f"{mode}: {len(run(mode, 2)['losses'])} losses, expected 6")
    m = re.search(rf"--dist {mode} on 2 GPUs against one process .*largest relative loss difference ([0-9.e+-]+)", table)
    if not m or float(m.group(1)) > 1e-5:
        bad.append(f"{mode}: loss difference line {m.group(0) if m else 'missing'}")
    if not re.search(rf"--dist {mode} \| 2 \| [0-9,]+ \| [0-9.]+% \|", table):
        bad.append(f"{mode}: no scaling figure for 2 ranks")
z1, z2 = run("zero2", 1)["optimizer_mib_per_rank"], run("zero2", 2)["optimizer_mib_per_rank"]
d1, d2 = run("ddp", 1)["optimizer_mib_per_rank"], run("ddp", 2)["optimizer_mib_per_rank"]
if abs(z2 - z1 / 2) > 0.01 * z1:
    bad.append(f"zero2 optimizer + masters per rank {z1} MiB on 1 rank, {z2} on 2 (expected half)")
if d1 != d2:
    bad.append(f"ddp optimizer + masters per rank {d1} MiB on 1 rank, {d2} on 2 (expected the same)")
print("\n".join(bad) or "dist bench on CPU: losses, scaling and optimizer memory as expected")
sys.exit(1 if bad else 0)
PY
