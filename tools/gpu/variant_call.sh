#!/usr/bin/env bash
# On the GPU machine, one call for kernel variants (the short windows the device tool lends rarely
# allow two): the tree's tests by regex, each variant's test binary with the variant's
# libloom_kernels.so, the variants timed against the tree (ab_variants.sh), then Nsight Compute
# profiles of the tree with their warp-state tables (ncu_stalls.py) while time is left. Every stage
# is optional; outputs stay under five files in $OUT (the device tool brings back a few).
#   here:  tools/gpu/prebuild.sh; tools/gpu/variant_archive.sh NAME PATCH   (for each variant)
#   there (carry .devdeps .prebuilt scratch/variants):
#     CTEST_R='AttentionCuda|FlashKernels|NanPropagationCuda' VARS="v1 v2" \
#       FILTER='^attention_fwd/bf16/b4_s2048' NCU_PAIRS="attention_fwd/bf16/b4_s2048_h32_kv8_d64|flash_fwd_sm90_ws" \
#       tools/gpu/variant_call.sh
# Environment: CTEST_R (ctest -R regex on the tree), VARS (names of scratch/variants/NAME.tar.xz),
# TEST_BIN (the variants' test binary, default kernels_test_attention_cuda), FILTER and ROUNDS (the
# A/B's benchmarks and rounds, default 2), NCU_PAIRS ("benchmark|kernel-regex" words),
# NCU_UNTIL (seconds since the start after which no profile starts, default 400).
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}; mkdir -p "$out"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 )) s] $*"; }
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
source tools/gpu/prebuilt.sh
[ "$LOOM_PREBUILT" = 1 ] || tools/gpu/build.sh loom_bench "${TEST_BIN:-kernels_test_attention_cuda}" > /dev/null 2>&1 ||
  { echo "variant_call: build failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

if [ -n "${CTEST_R:-}" ]; then
  timeout 300 ctest --test-dir build-gpu -R "$CTEST_R" -j4 --output-on-failure > "$out/ctest.log" 2>&1
  echo "ctest -R '$CTEST_R': exit $?"; tail -5 "$out/ctest.log"
  el ctest
fi

if [ -n "${VARS:-}" ] && [ "$LOOM_PREBUILT" != 1 ]; then
  echo "variant_call: the variants' archives hold libloom_kernels.so alone and need the tree's shared build" \
    "(carry .prebuilt made by tools/gpu/prebuild.sh from these sources); no A/B"
elif [ -n "${VARS:-}" ]; then
  bin=$(find build-gpu -name "${TEST_BIN:-kernels_test_attention_cuda}" -type f -perm -u+x | head -1)
  pairs="main:tree"
  for n in $VARS; do
    pairs="$pairs $n:scratch/variants/$n.tar.xz"
    rm -rf "build-$n" && mkdir -p "build-$n" && tar -C "build-$n" -xJf "scratch/variants/$n.tar.xz" ||
      { echo "variant_call: cannot unpack scratch/variants/$n.tar.xz"; exit 1; }
    LD_LIBRARY_PATH="$PWD/build-$n/kernels:${LD_LIBRARY_PATH:-}" timeout 300 "$bin" > "/tmp/variant_test_$n.log" 2>&1
    echo "$n: $(basename "$bin") exit $? ($(grep -E '^\[  (PASSED|FAILED) ' "/tmp/variant_test_$n.log" | tr '\n' ' '))"
    grep -E "Failure|FAILED" "/tmp/variant_test_$n.log" | head -5
  done
  OUT=/tmp/variant_ab VARIANTS="$pairs" FILTER="${FILTER:-.}" ROUNDS="${ROUNDS:-2}" tools/gpu/ab_variants.sh > /tmp/variant_ab.log 2>&1 ||
    tail -5 /tmp/variant_ab.log
  cp /tmp/variant_ab/variants/table.txt "$out/ab_table.txt" && cat "$out/ab_table.txt"
  el "A/B"
fi

[ -z "${NCU_PAIRS:-}" ] || command -v ncu > /dev/null || { echo "variant_call: no ncu on this machine, no profiles"; NCU_PAIRS=""; }
for pair in ${NCU_PAIRS:-}; do
  case=${pair%%|*} kernel=${pair#*|}
  tag=$(echo "$case" | sed 's|/bf16/|_|; s|/|_|g')
  [ $(( $(date +%s) - t0 )) -lt "${NCU_UNTIL:-400}" ] || { el "ncu $tag skipped (time)"; continue; }
  timeout 150 ncu --set full --import-source no -k "regex:$kernel" -c 1 -o "/tmp/ncu_$tag" build-gpu/bench/loom_bench \
    --benchmark_min_time=0.001 --benchmark_filter="^$case/" > "/tmp/ncu_$tag.log" 2>&1
  ncu -i "/tmp/ncu_$tag.ncu-rep" --page details > "/tmp/ncu_$tag.txt" 2>&1
  ncu -i "/tmp/ncu_$tag.ncu-rep" --page source --print-source sass --csv 2>/dev/null | xz > "/tmp/ncu_src_$tag.csv.xz"
  python3 tools/gpu/ncu_stalls.py "/tmp/ncu_src_$tag.csv.xz" --top 40 --title "$case" > "/tmp/ncu_stalls_$tag.txt" 2>&1
  { echo "=== $case ($kernel)"; cat "/tmp/ncu_$tag.txt"; echo; cat "/tmp/ncu_stalls_$tag.txt"; } | xz >> "$out/ncu.txt.xz"
  grep -E "Duration|Issue Slots Busy|Compute \(SM\) Throughput|Registers Per" "/tmp/ncu_$tag.txt" | head -5
  head -16 "/tmp/ncu_stalls_$tag.txt"
  el "ncu $tag"
done
