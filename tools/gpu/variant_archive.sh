#!/usr/bin/env bash
# On the CPU machine, after tools/gpu/prebuild.sh: one kernel variant for tools/gpu/ab_variants.sh as an
# archive of bench/loom_bench and kernels/libloom_kernels.so alone (about 3.6 MB with xz -9e, against
# 5.7 MB with every shared library), so that four variants travel beside .prebuilt and .devdeps under
# the 64 MiB a device call carries. The patch is applied to the tree, loom_bench is built in build-gpu
# (the changed CUDA files only; with the launcher prebuild.sh configured, ccache), the two files are packed, and the patch is
# reversed; the tree's build-gpu is left with the variant's objects, so run prebuild.sh again before
# the tree's own archive is used here (on the GPU machine the carried .prebuilt is what runs).
# On the GPU machine ab_variants.sh puts the variant's kernels/ first on LD_LIBRARY_PATH; the other
# libraries resolve through the binaries' RUNPATH to the tree's build-gpu, which the variant must
# therefore match outside libloom_kernels.so (a patch that changes another library's sources, or a
# header it compiles, needs a whole archive: prebuild.sh's).
#   tools/gpu/variant_archive.sh NAME PATCH      -> scratch/variants/NAME.tar.xz
#   (then: carry .devdeps .prebuilt scratch/variants;
#    VARIANTS="main:tree NAME:scratch/variants/NAME.tar.xz" FILTER=... tools/gpu/ab_variants.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?variant name} patch=${2:?patch file (git diff of the tree)}
[ -f build-gpu/build.ninja ] || { echo "variant_archive: no build-gpu here; run tools/gpu/prebuild.sh first" >&2; exit 1; }
git apply --check "$patch"
changed=$(git apply --numstat "$patch" | cut -f3)
if echo "$changed" | grep -qv '^kernels/cuda/'; then
  echo "variant_archive: $patch changes files outside kernels/cuda/ ($(echo "$changed" | grep -v '^kernels/cuda/' | tr '\n' ' '));" \
    "the archive would hold libloom_kernels.so alone" >&2
  exit 1
fi
git apply "$patch"
trap 'git apply -R "$patch"' EXIT
ninja -C build-gpu -j"${JOBS:-$(nproc)}" loom_bench > "/tmp/variant_$name.log" 2>&1 ||
  { tail -30 "/tmp/variant_$name.log"; exit 1; }
stage=$(mktemp -d)
mkdir -p "$stage/bench" "$stage/kernels" scratch/variants
cp build-gpu/bench/loom_bench "$stage/bench/"
cp -L build-gpu/kernels/libloom_kernels.so "$stage/kernels/"
strip --strip-unneeded "$stage/bench/loom_bench" "$stage/kernels/libloom_kernels.so"
tar -C "$stage" -cf - bench kernels | xz -T0 -9e > "scratch/variants/$name.tar.xz"
rm -rf "$stage"
echo "variant_archive: scratch/variants/$name.tar.xz ($(du -h "scratch/variants/$name.tar.xz" | cut -f1)) from $patch"
