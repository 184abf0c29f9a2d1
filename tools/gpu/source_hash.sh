#!/usr/bin/env bash
# Prints one hash of the sources a build reads (C++, CUDA and CMake files outside build folders),
# the same on the CPU machine and on the GPU machine's copy of the tree (no git needed there).
# tools/gpu/trace is left out: the build does not read it (tools/gpu/trace/build.sh compiles it there);
# so is scratch/ (ignored working files: a .cu kept there and not carried changed the hash, session 56).
set -euo pipefail
cd "$(dirname "$0")/../.."
find . \( -path './build*' -o -path './.git' -o -path './.devdeps' -o -path './.peers' -o -path './.prebuilt' \
          -o -path './.whl' -o -path './scratch' -o -path './shared' -o -path './tools/gpu/trace' \) -prune -o -type f \
     \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name 'CMakeLists.txt' -o -name '*.cmake' \
        -o -name '*.cmake.in' \) -print |
  LC_ALL=C sort | while IFS= read -r f; do printf '%s %s\n' "$(sha1sum < "$f" | cut -c1-40)" "$f"; done |
  sha1sum | cut -c1-16
