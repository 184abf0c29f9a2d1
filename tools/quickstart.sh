#!/usr/bin/env bash
# Quick start: installs what Loom needs, builds it, and runs the demo (examples/demo/run.sh):
# initialise a small Llama-style model, train a LoRA adapter on a text shipped in the repository
# with the loss printed as it falls, save the adapter, and generate a sample from it. On a GPU
# machine the training runs on CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/configure.sh
build=${LOOM_BUILD_DIR:-build}
if "$build/tools/loom" demo --device cuda --steps 1 >/dev/null 2>&1; then
  exec examples/demo/run.sh "$build" --device cuda "$@"
fi
exec examples/demo/run.sh "$build" "$@"
