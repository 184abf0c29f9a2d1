#!/usr/bin/env bash
# Checks the installed package as another program sees it: builds Loom's libraries in
# ${LOOM_BUILD_DIR:-build} (configured CPU-only when that folder is new), installs them into a
# temporary prefix, builds examples/standalone with find_package(Loom) and runs it on the tiny
# Llama fixture (five LoRA steps; it exits non-zero unless the loss falls and the adapter is saved).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${LOOM_BUILD_DIR:-build}
work=$(mktemp -d "${TMPDIR:-/tmp}/loom-check-install.XXXXXX")
trap 'rm -rf "$work"' EXIT

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA="${LOOM_CUDA:-OFF}" >/dev/null
fi

# Only what `cmake --install` copies, not the tests: cheap when the folder is already built.
targets=(loom_kernels loom_engine loom_autograd loom_models loom_text loom)
cmake --build "$build" --target help | grep -qw loom_train && targets+=(loom_train)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
cmake --install "$build" --prefix "$work/prefix" >/dev/null

build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S examples/standalone -B "$work/standalone" "${generator[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE="${build_type:-Release}" >/dev/null
cmake --build "$work/standalone" -j"$(nproc)"
"$work/standalone/lora_finetune" "$root/tests/fixtures/models/llama" "$work/adapter"
test -s "$work/adapter/adapter_model.safetensors" && test -s "$work/adapter/adapter_config.json"
echo "check_install: OK (find_package(Loom) from $(basename "$work")/prefix, example trained and saved an adapter)"
