#!/usr/bin/env bash
# On the GPU machine, one device call (under 600 s with the prebuilt binaries) for the choices still being
# measured (kernels/experiment.h): the CUDA tests of the code not yet run on a GPU (attention, the timed
# GEMM choice, scale_blocks, the grouped GEMMs with the TMA kernel, NF4), the 1B LoRA step's base
# products with the heuristic's and the timed algorithm (bench gemm/bf16/llama1b_*), the 1B `none` row
# with LOOM_GEMM_TIMED 0 and 1, and Qwen3-30B-A3B's shape at 24 layers (QLoRA recompute: default,
# TMA + NF4 in the GEMM, NF4 in the cp.async GEMM, first; LoRA recompute: TMA, default, last). Prints each test's
# verdict, the product table and one line per e2e row; JSON under $OUT (gemm_tuned.json, e2e.jsonl,
# moe.jsonl, logs.tgz). Each e2e row is started only while the call has time for it.
# OQ_LIMIT (default 590): the seconds the call may run; a row starts only while its usual time is left.
#   export OUT; tools/gpu/open_questions.sh        (carry .devdeps and .prebuilt)
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-gpu-open-out}; mkdir -p "$OUT"; [ -f .devdeps/env.sh ] && source .devdeps/env.sh
T0=$(date +%s); LIMIT=${OQ_LIMIT:-590}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }; el() { echo "[t=$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
tools/gpu/build.sh > $W/build.log 2>&1; tail -1 $W/build.log; el
B=build-gpu/tests
t() { local name=$1 to=$2; shift 2; timeout $to "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name: exit $rc $(grep -E '^\[  (PASSED|FAILED) ' $W/$name.log | tr '\n' ' ')"; grep -E "^\[  FAILED|Failure" $W/$name.log | head -6; return $rc; }
t attn 60 $B/kernels/kernels_test_attention_cuda
t gemm 60 $B/kernels/kernels_test_gemm_cuda
t sb 30 $B/kernels/kernels_test_elementwise_cuda --gtest_filter='*ScaleBlocks*'
t gg 120 $B/kernels/kernels_test_grouped_gemm_cuda --gtest_filter='GroupedGemmCuda.*:-*Qwen3*'; grc=$?
t nf4 60 $B/kernels/kernels_test_grouped_gemm_nf4_cuda; el
export LOOM_MOE_RUN_TIMEOUT=120 LOOM_MOE_LAYERS=24 LOOM_MOE_PEERS=" " LOOM_MOE_PREVIOUS=$OUT/moe.jsonl
touch $OUT/moe.jsonl
m() { [ "$(left)" -gt 140 ] || return; env "$@" bash bench/e2e/moe.sh qwen3moe30b > $W/moe.log 2>&1; tail -2 $OUT/moe.jsonl | cut -c1-300; el; }
m LOOM_MOE_MODES=" " LOOM_MOE_QLORA_MODES=recompute
[ $grc = 0 ] && m LOOM_EXPERTS_TMA=1 LOOM_NF4_IN_GEMM=1 LOOM_MOE_MODES=" " LOOM_MOE_QLORA_MODES=recompute
m LOOM_NF4_IN_GEMM=1 LOOM_MOE_MODES=" " LOOM_MOE_QLORA_MODES=recompute
timeout 60 build-gpu/bench/loom_bench --benchmark_filter='gemm/bf16/llama1b_' --benchmark_min_time=0.05s \
  --benchmark_out=$OUT/gemm_tuned.json --benchmark_out_format=json > /tmp/gemm.log 2>&1
python3 - $OUT/gemm_tuned.json <<'PY'
import json, sys
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("run_type") != "iteration" or "error_occurred" in b: continue
    n = b["name"].replace("/manual_time", "")
    rows[n] = (b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b["time_unit"]], b.get("flops_per_second", 0) / 1e12)
for n in sorted(rows):
    if n.endswith("/heuristic"):
        h, t = rows[n], rows.get(n[:-len("heuristic")] + "timed")
        print(f"{n[:-10]:50} heuristic {h[0]:8.1f} us {h[1]:4.0f} TF/s  timed " + (f"{t[0]:8.1f} us {t[1]:4.0f} TF/s  ratio {h[0]/t[0]:.3f}" if t else "-"))
PY
el
E=$OUT/e2e.jsonl; touch $E
r() { [ "$(left)" -gt 120 ] || return; env LOOM_E2E_PREVIOUS=$E OUT=/tmp/e "$@" timeout 150 bash bench/e2e/run.sh 1b > /tmp/e2e.log 2>&1; cp /tmp/e/e2e.jsonl $E; tail -1 $E | cut -c1-250; el; }
r LOOM_GEMM_TIMED=0 LOOM_E2E_MODES=none LOOM_E2E_PEERS=" "
r LOOM_GEMM_TIMED=1 LOOM_E2E_MODES=none LOOM_E2E_PEERS=" "
[ $grc = 0 ] && m LOOM_EXPERTS_TMA=1 LOOM_MOE_MODES=recompute LOOM_MOE_QLORA_MODES=" "
m LOOM_MOE_MODES=recompute LOOM_MOE_QLORA_MODES=" "
tar -C $W -czf $OUT/logs.tgz . ; ls -la $OUT
