# Sourced by the GPU scripts on the GPU machine: unpacks .prebuilt/build-gpu.tar.xz (made on the
# CPU machine by tools/gpu/prebuild.sh) into build-gpu when it was built from these very sources and
# its binaries start here, and sets LOOM_PREBUILT=1; otherwise leaves LOOM_PREBUILT=0 and the
# script builds as before. Prints one line saying which. LOOM_PREBUILT=0 in the environment skips it.
_loom_prebuilt() {
  local archive=.prebuilt/build-gpu.tar.xz root want have
  [ "${LOOM_PREBUILT:-}" = 0 ] && { echo "prebuilt: not used (LOOM_PREBUILT=0)"; return 1; }
  [ -f "$archive" ] || { echo "prebuilt: none carried, building here"; return 1; }
  want=$(tools/gpu/source_hash.sh)
  have=$(tar -xJOf "$archive" SOURCE_HASH 2> /dev/null || true)
  [ "$want" = "$have" ] || { echo "prebuilt: made from other sources ($have, these are $want), building here"; return 1; }
  root=$(tar -xJOf "$archive" SOURCE_ROOT)
  # On the machine and checkout that made the archive (a GPU script tried out on the CPU machine),
  # build-gpu is the build it was packed from (prebuild.sh's PACKED_HASH): unpacking over it would
  # throw away its objects. On the GPU machine the archive's path leads here too, but a build-gpu made
  # there (a script that built here before) has no PACKED_HASH and is replaced.
  if [ "$(cd "$root" 2> /dev/null && pwd -P)" = "$(pwd -P)" ] && [ -f build-gpu/CMakeCache.txt ] &&
     [ "$(cat build-gpu/PACKED_HASH 2> /dev/null)" = "$want" ]; then
    echo "prebuilt: build-gpu is the build the archive was made from, kept as it is"
    return 0
  fi
  # The binaries, their RUNPATHs and CTest's files name the CPU machine's checkout: make that path
  # lead here.
  if [ "$(cd "$root" 2> /dev/null && pwd -P)" != "$(pwd -P)" ]; then
    [ -e "$root" ] && { echo "prebuilt: $root exists here and is another folder, building here"; return 1; }
    mkdir -p "$(dirname "$root")" && ln -s "$(pwd -P)" "$root" || { echo "prebuilt: cannot link $root, building here"; return 1; }
  fi
  rm -rf build-gpu && mkdir -p build-gpu && tar -C build-gpu -xJf "$archive" || { echo "prebuilt: unpacking failed"; return 1; }
  if ! build-gpu/tools/loom --version > /dev/null 2>&1; then
    echo "prebuilt: build-gpu/tools/loom does not start here ($(build-gpu/tools/loom --version 2>&1 | head -2 | tr '\n' ' ')), building here"
    rm -rf build-gpu
    return 1
  fi
  echo "prebuilt: using build-gpu from $root (sources $want)"
}
if _loom_prebuilt; then export LOOM_PREBUILT=1; else export LOOM_PREBUILT=0; fi
unset -f _loom_prebuilt
