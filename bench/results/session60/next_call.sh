#!/usr/bin/env bash
# Session 60's device call (run once, on an H100: README section 3; dqfold lost on time and was rejected,
# so as a template swap in the next variants). It checks
# on the GPU what sessions 59 and 60 built here: the landed forward (bc9501d, 39317ec: tests, and the
# A/B against the kernels before it, variant `before`), and the dQ finished inside the backward kernel
# (variant `dqfold`, bench/results/session60/dqfold.diff: its tests in every suite that runs
# attention's backward on the GPU, the A/B, SDPA's table with it), then `ctest -L cuda` on the tree.
# On the CPU machine first (about 5 minutes with ccache):
#   tools/gpu/prebuild.sh
#   git diff HEAD bc9501d~1 -- kernels/cuda > /tmp/before.diff && tools/gpu/variant_archive.sh before /tmp/before.diff
#   tools/gpu/variant_archive.sh dqfold bench/results/session60/dqfold.diff
#   tools/gpu/prebuild.sh   # again: variant_archive.sh leaves the last variant's objects in build-gpu
# Device call (carry .devdeps .prebuilt scratch/variants; .peers too for the e2e row at the end):
#   LIMIT=540 bash bench/results/session60/next_call.sh
# A/B ratios are variant / tree: above 1 the variant is slower (for `before`, above 1 = the tree is faster).
set -u
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh  # absl's libraries: without them most test binaries do not start
source tools/gpu/prebuilt.sh
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 )) s] $*"; }; left() { echo $(( ${LIMIT:-540} - ($(date +%s) - T0) )); }

# 1. The tree's attention tests, each variant's kernels_test_attention_cuda, the A/B (medians of 2 rounds).
FOLD=${FOLD:-dqfold}  # the variant whose library the other suites and SDPA's table run with
CTEST_R='AttentionCuda|FlashKernels|NanPropagationCuda' VARS=${VARS:-"before dqfold"} ROUNDS=2 \
  FILTER='^attention_(fwd|bwd)/bf16/b4_s2048_h32_kv8_d(64|128)/|^attention_fwd/bf16/b4_s2048_h16_kv8_d256/|^attention_fwdbwd/bf16/b4_s2048_h32_kv8_d128/|^attention_bwd/bf16/b1_s8192_h32_kv8_d128/' \
  tools/gpu/variant_call.sh 2>&1 | grep -v "^\s*$" | tail -30
el "variant_call"

# 2. dqfold in the other suites whose CUDA tests run attention's backward: rope_q on the flash path
# (engine), NaN propagation, the families against transformers' gradients, checkpointing.
ok=1
for t in engine_test_ops_cuda kernels_test_nan_propagation_cuda models_test_families_cuda models_test_checkpointing_cuda; do
  bin=$(find build-gpu -name "$t" -type f -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "$FOLD: no $t"; continue; }
  LD_LIBRARY_PATH="$PWD/build-$FOLD/kernels:${LD_LIBRARY_PATH:-}" timeout 90 "$bin" > "/tmp/fold_$t.log" 2>&1
  rc=$?; [ $rc = 0 ] || ok=0
  echo "$FOLD $t exit $rc $(grep -E '^\[  (PASSED|FAILED) ' "/tmp/fold_$t.log" | tr '\n' ' ')"
  grep -E "Failure|FAILED" "/tmp/fold_$t.log" | head -4
done
cat /tmp/fold_*.log | xz > "$OUT/${FOLD}_tests.log.xz"
el "dqfold suites"

# 3. SDPA in the same run, with the variant's library where it passed (its forward is the tree's).
S='(b4_s2048_h32_kv8_d(64|128)|b1_s8192_h32_kv8_d128)'
lib=""; [ $ok = 1 ] && lib="$PWD/build-$FOLD/kernels:"
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:-}" \
  LOOM_BENCH_ARGS="--benchmark_filter=^attention_(fwd|bwd|fwdbwd)/bf16/$S/ --benchmark_repetitions=3" \
  LOOM_PEER_ARGS="--filter ^attention_(fwd|bwd|fwdbwd)/bf16/$S(/|\$)" timeout 150 bench/run_all.sh /tmp/sdpa > /tmp/sdpa.log 2>&1
f=$(ls /tmp/sdpa/*.md 2>/dev/null | head -1)
[ -n "$f" ] && cp "$f" "$OUT/attention_vs_sdpa_$([ $ok = 1 ] && echo "$FOLD" || echo tree).md" && grep "attention_" "$f" | cut -d'|' -f2-6
el "sdpa"

# 4. The tree's whole CUDA suite with what is left.
if [ "$(left)" -gt 90 ]; then
  timeout $(( $(left) - 10 )) ctest --test-dir build-gpu -L cuda -j4 --output-on-failure > "$OUT/ctest_cuda.log" 2>&1
  echo "ctest -L cuda exit $?"; tail -4 "$OUT/ctest_cuda.log"
fi
el "ctest"
# Next (a call of its own, if dqfold passed and won; each call starts a fresh machine, so unpack it again):
#   source tools/gpu/prebuilt.sh; mkdir -p build-dqfold && tar -C build-dqfold -xJf scratch/variants/dqfold.tar.xz
#   LD_LIBRARY_PATH=$PWD/build-$FOLD/kernels LOOM_E2E_MODES=none LOOM_E2E_PEERS=unsloth LOOM_E2E_UNSLOTH=lora-nogc bench/e2e/run.sh 1b
# (loom's RUNPATH yields to LD_LIBRARY_PATH), then land the patch (git apply) with its figures.
