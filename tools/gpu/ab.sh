#!/usr/bin/env bash
# On the GPU machine: a before/after of a change on one card in one call. "before" is an archive
# tools/gpu/prebuild.sh made from the sources before the change (copy .prebuilt/build-gpu.tar.xz to
# .prebuilt/base.tar.xz, or the archive AB_BASE names, then change the sources and run prebuild.sh
# again); "after" is this
# tree's build-gpu (tools/gpu/prebuilt.sh, else built here). Both loom_bench runs alternate for
# AB_ROUNDS rounds (default 2) on the benchmarks AB_FILTER picks; AB_E2E names `loom train`
# checkpointing modes for the scoreboard rows of each shape AB_E2E_SHAPES names (default 1b; bench/e2e/run.sh,
# Loom only), AB_E2E_ROUNDS times alternating (default 1; the medians are printed).
#   export OUT; AB_FILTER='d64' AB_E2E="none" tools/gpu/ab.sh      (carry .devdeps and .prebuilt)
# Results under $OUT: bench-{before,after}-<round>.json and .txt, e2e-{before,after}.jsonl, ab.txt
# (each benchmark's median real time before and after, and their ratio).
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-ab-out}; mkdir -p "$OUT"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
source tools/gpu/prebuilt.sh
[ "$LOOM_PREBUILT" = 1 ] || tools/gpu/build.sh loom loom_bench > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
base=${AB_BASE:-.prebuilt/base.tar.xz}
[ -f "$base" ] || { echo "ab.sh: no $base (the 'before' archive)"; exit 1; }
rm -rf build-base && mkdir -p build-base && tar -C build-base -xJf "$base" || exit 1
echo "before: sources $(cat build-base/SOURCE_HASH); after: sources $(tools/gpu/source_hash.sh)"
# The base binaries' RUNPATH names the CPU machine's build-gpu (linked to this one's): its own
# libraries go first through LD_LIBRARY_PATH.
base_libs=$(find "$PWD/build-base" -name '*.so*' -printf '%h\n' | sort -u | tr '\n' ':')
before() { LD_LIBRARY_PATH="$base_libs${LD_LIBRARY_PATH:-}" "$@"; }
filter=${AB_FILTER:-.}
for r in $(seq "${AB_ROUNDS:-2}"); do
  before build-base/bench/loom_bench --benchmark_filter="$filter" --benchmark_out="$OUT/bench-before-$r.json" \
    --benchmark_out_format=json > "$OUT/bench-before-$r.txt" 2>&1
  build-gpu/bench/loom_bench --benchmark_filter="$filter" --benchmark_out="$OUT/bench-after-$r.json" \
    --benchmark_out_format=json > "$OUT/bench-after-$r.txt" 2>&1
done
python3 - "$OUT" > "$OUT/ab.txt" << 'PY'
import glob, statistics, sys
sys.path.insert(0, "tools/gpu")
from bench_medians import real_times
out = sys.argv[1]
times = real_times({side: glob.glob(f"{out}/bench-{side}-*.json") for side in ("before", "after")})
print(f"{'benchmark (median real time of the rounds)':72} {'before':>12} {'after':>12} {'after/before':>12}")
for name, t in times.items():
    if "before" in t and "after" in t:
        unit = t["after"][0][1]
        b = statistics.median(x for x, _ in t["before"])
        a = statistics.median(x for x, _ in t["after"])
        print(f"{name:72} {b:9.1f} {unit:2} {a:9.1f} {unit:2} {a / b:12.3f}")
PY
cat "$OUT/ab.txt"
for r in $(seq "${AB_E2E_ROUNDS:-1}"); do
for shape in ${AB_E2E_SHAPES:-1b}; do
for mode in ${AB_E2E:-}; do
  for side in before after; do
    if [ $side = before ]; then
      before env OUT="$OUT/e2e-$side" LOOM_BIN=build-base/tools/loom LOOM_E2E_MODES="$mode" LOOM_E2E_PEERS=" " \
        bench/e2e/run.sh "$shape" > /dev/null 2>&1
    else
      env OUT="$OUT/e2e-$side" LOOM_E2E_MODES="$mode" LOOM_E2E_PEERS=" " bench/e2e/run.sh "$shape" > /dev/null 2>&1
    fi
    cat "$OUT/e2e-$side/e2e.jsonl" >> "$OUT/e2e-$side.jsonl" 2> /dev/null
    rm -rf "$OUT/e2e-$side"
    echo "$side $shape $mode: $(tail -1 "$OUT/e2e-$side.jsonl" | cut -c1-260)"
  done
done
done
done
# Each mode's median tokens/s over the rounds, before and after (the rounds alternate the two builds).
[ -n "${AB_E2E:-}" ] && python3 - "$OUT" << 'PY'
import json, statistics, sys
rows = {}
for side in ("before", "after"):
    try:
        for line in open(f"{sys.argv[1]}/e2e-{side}.jsonl"):
            r = json.loads(line)
            if r.get("ok"):
                rows.setdefault(f'{r.get("shape", "")} {r["who"]}', {}).setdefault(side, []).append(r["tok_s"])
    except OSError:
        pass
for who, t in rows.items():
    if "before" in t and "after" in t:
        b, a = statistics.median(t["before"]), statistics.median(t["after"])
        print(f"e2e {who}: before {t['before']} median {b:.0f}, after {t['after']} median {a:.0f}: {a / b:.4f}x")
PY
