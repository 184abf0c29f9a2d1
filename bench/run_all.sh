#!/usr/bin/env bash
# Runs loom_bench (console table + OUTDIR/bench.json), then the PyTorch peer (OUTDIR/torch.json) when
# python3 can import torch with a GPU, then compare.py (OUTDIR/compare.txt, OUTDIR/compare.md).
#   bench/run_all.sh [OUTDIR]          (default OUTDIR: bench-out)
# Environment: LOOM_BENCH (binary, default build-gpu/bench/loom_bench), LOOM_BENCH_ARGS (extra
# flags, e.g. "--benchmark_filter=gemm --benchmark_repetitions=3"), LOOM_PEER_ARGS (extra flags for
# peer_torch.py, e.g. "--filter gemm"), LOOM_SKIP_TORCH=1 to skip the peer, PYTHON (default python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-bench-out}"
bin="${LOOM_BENCH:-build-gpu/bench/loom_bench}"
py="${PYTHON:-python3}"
mkdir -p "$out"

if [[ ! -x "$bin" ]]; then
  echo "run_all.sh: no loom_bench at '$bin' (build target loom_bench, or set LOOM_BENCH)" >&2
  exit 1
fi

echo "== loom_bench ($bin) =="
# shellcheck disable=SC2086
"$bin" --benchmark_out="$out/bench.json" --benchmark_out_format=json ${LOOM_BENCH_ARGS:-} 2>&1 | tee "$out/bench.txt"

torch_json=""
if [[ "${LOOM_SKIP_TORCH:-0}" != 1 ]] && "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "== PyTorch peer =="
  # shellcheck disable=SC2086
  if PYTHONUNBUFFERED=1 "$py" "$here/peer_torch.py" --out "$out/torch.json" ${LOOM_PEER_ARGS:-} 2>&1 | tee "$out/torch.txt"; then
    torch_json="$out/torch.json"
  else
    echo "run_all.sh: peer_torch.py failed; comparing Loom alone" >&2
  fi
else
  echo "== PyTorch peer skipped (no python3 with torch and CUDA, or LOOM_SKIP_TORCH=1) =="
fi
peer=()
[[ -n "$torch_json" && -s "$torch_json" ]] && peer=("$torch_json")

echo "== comparison =="
"$py" "$here/compare.py" "$out/bench.json" "${peer[@]}" | tee "$out/compare.txt"
"$py" "$here/compare.py" "$out/bench.json" "${peer[@]}" --markdown > "$out/compare.md"
echo "run_all.sh: results in $out/ (bench.json, torch.json, compare.txt, compare.md)"
