#!/usr/bin/env bash
# Quick start: installs what Loom needs, builds it, and runs the demo training (a small
# Llama-style model learning a token pattern, loss printed per step). On a GPU machine the demo
# runs on CUDA in bf16.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/configure.sh
build=${LOOM_BUILD_DIR:-build}
if "$build/tools/loom" demo --device cuda --steps 1 >/dev/null 2>&1; then
  exec "$build/tools/loom" demo --device cuda --bf16 --steps 40 "$@"
fi
exec "$build/tools/loom" demo --device cpu --steps 40 "$@"
