#!/usr/bin/env bash
# On the CPU machine (no GPU needed): builds what the GPU scripts run (the CUDA tests, loom_bench,
# loom) for sm_90a into build-gpu, and packs the binaries with CTest's files into
# .prebuilt/build-gpu.tar.xz, so that a GPU call spends its minutes testing and timing instead of
# compiling. The GPU scripts source tools/gpu/prebuilt.sh, which unpacks the archive when it was
# made from the same sources and its binaries start there, and builds as before otherwise.
#   tools/gpu/prebuild.sh            # then carry .prebuilt (with .devdeps) in the device call
#   tools/gpu/prebuild.sh loom loom_bench kernels_test_rope_cuda   # only these targets (a fresh checkout
#                                    # builds every target in about an hour on 2 cores); ctest then runs
#                                    # only the tests whose binaries were built
# Portable build: shared Loom libraries (14 MB packed), host code for x86-64-v3 (AVX2: any server
# processor of the last ten years; -march=native would be this machine's), CUDA 13 as on that machine.
# The binaries and CTest's files name this checkout's absolute path; prebuilt.sh links that path to
# the device's copy of the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-$(command -v ccache || true)}
export CMAKE_CUDA_COMPILER_LAUNCHER=${CMAKE_CUDA_COMPILER_LAUNCHER:-$(command -v ccache || true)}
hash=$(tools/gpu/source_hash.sh)  # checked again once packed: sources edited meanwhile void the archive
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLOOM_BUILD_BENCH=ON -DLOOM_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DBUILD_SHARED_LIBS=ON -DLOOM_BUILD_EXAMPLES=OFF \
  "-DCMAKE_BUILD_RPATH=$root/build-gpu/extra-libs;/usr/local/cuda/lib64;/usr/local/cuda/targets/x86_64-linux/lib" > /dev/null
ninja -C build-gpu -j"${JOBS:-$(nproc)}" "$@"

# Debian's Google Benchmark soname (libbenchmark.so.1debian) is not on the GPU machine's Ubuntu:
# it travels in build-gpu/extra-libs, which the RUNPATH above names.
mkdir -p build-gpu/extra-libs
cp -L /lib/x86_64-linux-gnu/libbenchmark.so.1debian build-gpu/extra-libs/

# Stage the executables and shared libraries (ELF files, stripped) and what ctest reads, then pack.
rm -rf .prebuilt/stage && mkdir -p .prebuilt/stage
(cd build-gpu && find . -path ./CMakeFiles -prune -o -type f \( -perm -u+x -o -name '*.so*' \) -print |
   while IFS= read -r f; do head -c 4 "$f" | grep -q ELF && echo "$f"; done
  find . -type f \( -name 'CTestTestfile.cmake' -o -name '*_include.cmake' -o -name '*_tests.cmake' \)) |
  sed 's|^\./||' | sort -u | while IFS= read -r f; do
    mkdir -p ".prebuilt/stage/$(dirname "$f")" && cp -p "build-gpu/$f" ".prebuilt/stage/$f"
  done
find .prebuilt/stage -type f \( -perm -u+x -o -name '*.so*' \) ! -path '*/extra-libs/*' -exec strip --strip-unneeded {} +
echo "$hash" > .prebuilt/stage/SOURCE_HASH
echo "$root" > .prebuilt/stage/SOURCE_ROOT
tar -C .prebuilt/stage -cf - SOURCE_HASH SOURCE_ROOT $(ls .prebuilt/stage | grep -v "^SOURCE_") | xz -T0 -9 > .prebuilt/build-gpu.tar.xz.tmp
if [ "$(tools/gpu/source_hash.sh)" != "$hash" ]; then
  echo "prebuild: the sources changed while building; run it again" >&2
  rm -f .prebuilt/build-gpu.tar.xz.tmp .prebuilt/build-gpu.tar.xz
  exit 1
fi
mv .prebuilt/build-gpu.tar.xz.tmp .prebuilt/build-gpu.tar.xz
echo "$hash" > build-gpu/PACKED_HASH  # tools/gpu/prebuilt.sh: this build-gpu is the one packed
echo "prebuild: $(find .prebuilt/stage -type f | wc -l) files, $(du -h .prebuilt/build-gpu.tar.xz | cut -f1) packed" \
  "for $root (sources $(cat .prebuilt/stage/SOURCE_HASH))"
rm -rf .prebuilt/stage
