#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, LOOM_FUZZ=ON) in ${LOOM_FUZZ_BUILD_DIR:-build-fuzz}
# and runs each for SECONDS (default 600), one after another, in-process on one core, seeded from
# tests/fuzz/corpus/<target>/. New coverage goes to build-fuzz/corpus/<target>/; a crash, leak,
# timeout or out-of-memory input is written to build-fuzz/findings/<target>/ and fails the script.
# `tools/fuzz/fuzz.sh --replay` runs every corpus input once instead (seconds); `tools/fuzz/fuzz.sh --ci` (what
# tools/test.sh runs) also builds the unit tests in the same folder and runs them under the sanitizers
# (LOOM_SANITIZE_UNIT_EXCLUDE: a CTest -E regex of tests to leave out there).
#   usage: tools/fuzz/fuzz.sh [SECONDS] [TARGET...]   |   tools/fuzz/fuzz.sh --replay   |   tools/fuzz/fuzz.sh --ci
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${LOOM_FUZZ_BUILD_DIR:-build-fuzz}
replay=0 ci=0
if [ "${1:-}" = "--replay" ]; then replay=1; shift; fi
if [ "${1:-}" = "--ci" ]; then replay=1 ci=1; shift; fi
seconds=${1:-600}
shift || true
all=(fuzz_safetensors fuzz_gguf fuzz_tokenizer_load fuzz_tokenizer_encode fuzz_jsonl fuzz_chat_template
     fuzz_config fuzz_bnb fuzz_adapter_config fuzz_train_checkpoint fuzz_preference_jsonl fuzz_sentencepiece_model)
[ $# -gt 0 ] && targets=("$@") || targets=("${all[@]}")

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# -O1 (no NDEBUG: asserts stay on), line tables for the reports; benchmarks and examples are not needed.
CC=clang CXX=clang++ cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DLOOM_CUDA=OFF -DLOOM_FUZZ=ON -DLOOM_BUILD_BENCH=OFF \
  -DLOOM_BUILD_EXAMPLES=OFF >/dev/null
if ((ci)); then
  # The unit tests under the sanitizers: those of the readers of untrusted input (engine, text, train,
  # models' config/checkpoint/bitsandbytes loaders) and the CPU kernels (raw-pointer indexing); the
  # model-family numerics, autograd and optimizer suites are left to the normal build (they would
  # double CI's time). LOOM_SANITIZE_ALL=1 builds and runs every unit test instead.
  if [ "${LOOM_SANITIZE_ALL:-0}" = 1 ]; then
    cmake --build "$build" -j"$(nproc)"
  else
    san_tests=(loom_fuzz engine_test_safetensors engine_test_gguf engine_test_tensor text_test_tokenizer train_test_preference_data
               text_test_chat_template text_test_jinja text_test_jinja_limits text_test_gguf_tokenizer text_test_unicode_nfc train_test_data
               train_test_resource_limits train_test_schedule train_test_metrics models_test_config
               models_test_checkpoint models_test_load_errors models_test_bnb_checkpoint)
    for f in tests/kernels/test_*_cpu.cpp; do san_tests+=("kernels_$(basename "$f" .cpp)"); done
    cmake --build "$build" -j"$(nproc)" --target "${san_tests[@]}"
  fi
else
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
fi

# UBSan: a stack trace with each report (its findings abort: -fno-sanitize-recover).
export UBSAN_OPTIONS=print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1
if ((replay)); then
  start=$(date +%s)
  ctest --test-dir "$build" -L fuzz --output-on-failure -j"$(nproc)"
  echo "fuzz replay: every corpus input clean under ASan + UBSan in $(( $(date +%s) - start )) s"
  if ((ci)); then
    start=$(date +%s)
    # Test programs left unbuilt show up as <target>_NOT_BUILT: not run here.
    ctest --test-dir "$build" -L unit -E "_NOT_BUILT|${LOOM_SANITIZE_UNIT_EXCLUDE:-^$}" --output-on-failure \
      -j"$(nproc)" --timeout 1200
    echo "sanitizer unit tests: clean under ASan + UBSan in $(( $(date +%s) - start )) s"
  fi
  exit 0
fi
# detect_leaks: LeakSanitizer at exit and every few thousand runs; a 2 GiB RSS and a 1 GiB single
# malloc limit catch unbounded allocations (a header claiming 2^60 bytes), 10 s an input catches hangs.
# A target may have a dictionary (tests/fuzz/<target>.dict); fuzz_chat_template's inputs carry whole
# templates (deep nesting needs length), so it gets 1 MiB inputs.
status=0
for t in "${targets[@]}"; do
  work="$build/corpus/$t" findings="$build/findings/$t"
  mkdir -p "$work" "$findings"
  extra=(-max_len=262144)
  [ "$t" = fuzz_chat_template ] && extra=(-max_len=1048576)
  [ -f "tests/fuzz/$t.dict" ] && extra+=(-dict="tests/fuzz/$t.dict")
  echo "== $t: ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1 OMP_NUM_THREADS=1 "$build/tests/fuzz/$t" "$work" "tests/fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      "${extra[@]}" -artifact_prefix="$findings/" -print_final_stats=1 2>"$build/findings/$t.log"; then
    echo "$t: FAILED, see $build/findings/$t.log and $findings/"
    status=1
  fi
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|^stat::peak_rss_mb" "$build/findings/$t.log" || true
done
exit $status
