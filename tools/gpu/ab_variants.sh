#!/usr/bin/env bash
# On the GPU machine: loom_bench timings of several builds on one card in one call, alternating, with
# each benchmark's median and its ratio to the first build. Each build is an archive that
# tools/gpu/prebuild.sh made (copy .prebuilt/build-gpu.tar.xz aside after each variant's prebuild;
# only bench/loom_bench and the shared libraries are read, so an archive may be cut down to those),
# or "tree" for this tree's build-gpu (tools/gpu/prebuilt.sh, else built here). tools/gpu/ab.sh is
# the two-build form with end-to-end rows.
#   export OUT; VARIANTS="main:.prebuilt/base.tar.xz v1:.prebuilt/v1.tar.xz new:tree" \
#     FILTER='^attention_bwd/bf16/b4' ROUNDS=2 tools/gpu/ab_variants.sh      (carry .devdeps and .prebuilt)
# Results under $OUT/variants: <name>-<round>.json and .txt, table.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
source tools/gpu/prebuilt.sh
[ "$LOOM_PREBUILT" = 1 ] || tools/gpu/build.sh loom_bench > /dev/null 2>&1 || { echo "ab_variants: build failed"; exit 1; }
out=${OUT:-ab-out}/variants; mkdir -p "$out"
: "${VARIANTS:?name:archive pairs, the first the base}" "${FILTER:=.}"
for v in $VARIANTS; do
  n=${v%%:*} a=${v#*:}
  [ "$a" = tree ] && continue
  rm -rf "build-$n" && mkdir -p "build-$n" && tar -C "build-$n" -xJf "$a" || { echo "ab_variants: cannot unpack $a"; exit 1; }
done
for r in $(seq "${ROUNDS:-2}"); do
  for v in $VARIANTS; do
    n=${v%%:*} a=${v#*:}
    if [ "$a" = tree ]; then bin=build-gpu/bench/loom_bench libs=""
    else  # the archive's RUNPATH names the CPU machine's build-gpu: its own libraries go first
      bin=build-$n/bench/loom_bench libs=$(find "$PWD/build-$n" -name '*.so*' -printf '%h\n' | sort -u | tr '\n' ':')
    fi
    LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}" "$bin" --benchmark_filter="$FILTER" --benchmark_out="$out/$n-$r.json" \
      --benchmark_out_format=json > "$out/$n-$r.txt" 2>&1
  done
done
python3 tools/gpu/bench_medians.py "$out" $(for v in $VARIANTS; do echo "${v%%:*}"; done) > "$out/table.txt"
cat "$out/table.txt"
