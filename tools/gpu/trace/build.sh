#!/usr/bin/env bash
# On the GPU machine: compiles the CUPTI tracer (cupti_trace.cpp) into build-gpu/libcupti_trace.so and
# prints the variables that make a command record its timeline:
#   eval "$(tools/gpu/trace/build.sh)"; LOOM_TRACE_OUT=t.csv $LOOM_TRACE_ENV build-gpu/tools/loom train ...
#   python3 tools/gpu/trace/timeline.py t.csv
set -euo pipefail
cd "$(dirname "$0")/../../.."
cuda=${CUDA_HOME:-/usr/local/cuda}
lib=$(find -L "$cuda" /usr/lib/x86_64-linux-gnu -name 'libcupti.so*' -print -quit 2> /dev/null || true)
inc=$(find -L "$cuda" -name cupti.h -print -quit 2> /dev/null || true)
[ -n "$lib" ] && [ -n "$inc" ] || { echo "echo 'trace: no CUPTI under $cuda' >&2"; exit 1; }
mkdir -p build-gpu
g++ -std=c++17 -O2 -shared -fPIC -I"$(dirname "$inc")" tools/gpu/trace/cupti_trace.cpp "$lib" \
  -Wl,-rpath,"$(dirname "$lib")" -o build-gpu/libcupti_trace.so >&2 || { echo "echo 'trace: compiling failed' >&2"; exit 1; }
echo "export LOOM_TRACE_ENV='CUDA_INJECTION64_PATH=$(pwd)/build-gpu/libcupti_trace.so'"
