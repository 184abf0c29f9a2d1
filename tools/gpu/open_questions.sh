#!/usr/bin/env bash
# On the GPU machine, one short device call (about 300 s with the prebuilt binaries) for the choice still
# being measured (kernels/experiment.h: LOOM_GEMM_TIMED, cuBLASLt's candidates timed in interleaved rounds)
# and the dispatcher's latest change (the head_dim 129..256 backward on the warp-specialised kernel):
# the attention, GEMM and grouped-GEMM CUDA tests; the 1B LoRA step's base products with the heuristic's and the timed
# algorithm (bench gemm/bf16/llama1b_*); the 1B `none` row with LOOM_GEMM_TIMED 0 and 1; the head_dim 256
# attention (causal, and Gemma 3's w1024 sliding layer) beside PyTorch SDPA; Qwen3-30B-A3B's shape at
# 24 layers, QLoRA and LoRA recompute, as built (the TMA-fed expert kernel). Each step starts only while
# the call has time for it; JSON under $OUT (gemm_tuned.json, e2e.jsonl, moe.jsonl, bench_attn.json,
# torch.json) and the logs in logs.tgz. Session 40's first version of this script (git log) decided
# the expert kernels' two switches.
# OQ_LIMIT (default 300): the seconds the call may run.
#   export OUT; tools/gpu/open_questions.sh        (carry .devdeps and .prebuilt)
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-gpu-open-out}; mkdir -p "$OUT"; [ -f .devdeps/env.sh ] && source .devdeps/env.sh
T0=$(date +%s); LIMIT=${OQ_LIMIT:-300}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }; el() { echo "[t=$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
tools/gpu/build.sh > $W/build.log 2>&1; tail -1 $W/build.log; el
B=build-gpu/tests
t() { local name=$1 to=$2; shift 2; timeout $to "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name: exit $rc $(grep -E '^\[  (PASSED|FAILED) ' $W/$name.log | tr '\n' ' ')"; grep -E "^\[  FAILED|Failure" $W/$name.log | head -6; return $rc; }
t attn 60 $B/kernels/kernels_test_attention_cuda
t gemm 40 $B/kernels/kernels_test_gemm_cuda
# The grouped GEMMs lost their NF4 paths after session 40's measurements (eee7bb8): their bf16 tests.
t gg 90 $B/kernels/kernels_test_grouped_gemm_cuda --gtest_filter='GroupedGemmCuda.*:-*Qwen3*'
t gops 90 $B/engine/engine_test_grouped_matmul_cuda --gtest_filter='GroupedMatmulCuda.*:-*Qwen3*'; el
timeout 30 build-gpu/bench/loom_bench --benchmark_filter='gemm/bf16/llama1b_' --benchmark_min_time=0.05 \
  --benchmark_out=$OUT/gemm_tuned.json --benchmark_out_format=json > $W/gemm_bench.log 2>&1
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
r() { [ "$(left)" -gt 30 ] || return; env LOOM_E2E_PREVIOUS=$E OUT=/tmp/e "$@" timeout 60 bash bench/e2e/run.sh 1b > /tmp/e2e.log 2>&1; cp /tmp/e/e2e.jsonl $E; tail -1 $E | cut -c1-250; el; }
r LOOM_GEMM_TIMED=0 LOOM_E2E_MODES=none LOOM_E2E_PEERS=" "
r LOOM_GEMM_TIMED=1 LOOM_E2E_MODES=none LOOM_E2E_PEERS=" "
if [ "$(left)" -gt 50 ]; then
  s='b4_s2048_h16_kv8_d256(/|$)|b4_s2048_h8_kv4_d256_w1024'
  timeout 30 python3 bench/peer_torch.py --out $OUT/torch.json --filter "attention_(fwd|bwd|fwdbwd)/bf16/($s)" > $W/torch.log 2>&1
  timeout 30 build-gpu/bench/loom_bench --benchmark_filter="(attention_(fwd|bwd|fwdbwd)|flash_bwd/[a-z0-9_]+)/bf16/($s)" \
    --benchmark_out=$OUT/bench_attn.json --benchmark_out_format=json > $W/bench_attn.log 2>&1
  python3 bench/compare.py $OUT/bench_attn.json $OUT/torch.json | grep -E "attention_(fwd|bwd|fwdbwd)/|flash_"; el
fi
export LOOM_MOE_RUN_TIMEOUT=60 LOOM_MOE_LAYERS=24 LOOM_MOE_PEERS=" " LOOM_MOE_PREVIOUS=$OUT/moe.jsonl
touch $OUT/moe.jsonl
m() { [ "$(left)" -gt 35 ] || return; env "$@" bash bench/e2e/moe.sh qwen3moe30b > $W/moe.log 2>&1; tail -1 $OUT/moe.jsonl | cut -c1-300; el; }
m LOOM_MOE_MODES=" " LOOM_MOE_QLORA_MODES=recompute
m LOOM_MOE_MODES=recompute LOOM_MOE_QLORA_MODES=" "
tar -C $W -czf $OUT/logs.tgz . ; ls $OUT
