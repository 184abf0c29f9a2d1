#!/usr/bin/env bash
# Installs the Debian 12 packages Loom builds with (idempotent; needs root for apt-get).
# CUDA and NCCL come from the CUDA toolkit when it is installed; without nvcc the build is CPU-only.
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libeigen3-dev libabsl-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin python3-pip
          clang libclang-rt-dev libomp-dev)  # clang, libFuzzer, OpenMP: the sanitizer build (tools/fuzz/fuzz.sh)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
