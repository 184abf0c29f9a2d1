#!/usr/bin/env bash
# On the GPU machine, one call for the mixture-of-experts path (issue 33): builds loom, loom_bench and
# the grouped-GEMM / MoE / NF4 / attention CUDA tests into build-gpu, runs those tests, Loom's rows of
# bench/e2e/moe.sh on the Qwen3-30B-A3B 4-layer shape (LoRA none and recompute, QLoRA offload; no peers: add them with
# LOOM_MOE_PEERS), and the grouped-GEMM micro-benchmarks of Qwen3's expert products that
# autograd/fn_grouped.cpp runs (base, accumulate, LoRA factors, dual), each variant, and the QLoRA experts'
# batched NF4 dequantisation against one launch per expert.
# Writes ctest.txt, moe.jsonl, moe_table.md and grouped.txt under $OUT (default gpu-moe-out); with
# LOOM_MOE_PROFILE=1 also profile_<row>.txt, tools/gpu/kernel_profile.sh's per-kernel table of steps 2-4
# of each row of LOOM_MOE_PROFILE_ROWS (default "none qlora-offload": [qlora-]<checkpointing mode>) on
# LOOM_MOE_SHAPE (about 45 s each at the smoke shape).
# LOOM_MOE_SHAPE (default qwen3moe_smoke) picks moe.sh's shape for Loom's rows: qwen3moe30b with
# LOOM_MOE_LAYERS=24 is the 24-layer table's (about 15-18 s a row).
# LOOM_MOE_TESTS=0 / LOOM_MOE_BENCH=0 skip the CUDA tests (about 3 minutes) / the micro-benchmarks. Profiles
# at 24 layers take more than 5 minutes each under ncu: profile the smoke shape (the same layer).
#   tools/gpu/gpu_moe_check.sh      (about 2 minutes after a cold build)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
out=${OUT:-gpu-moe-out}
mkdir -p "$out"
tests="kernels_test_grouped_gemm_cuda engine_test_grouped_matmul_cuda engine_test_ops_moe_cuda models_test_moe_mlp_cuda
  models_test_moe_families_cuda kernels_test_nf4_cuda kernels_test_attention_cuda engine_test_memory_cuda
  autograd_test_long_lived_pool_cuda autograd_test_fn_grouped models_test_dequant_scratch kernels_test_embedding_cuda
  autograd_test_fn_moe models_test_moe_mlp models_test_moe_families models_test_recompute"
# shellcheck disable=SC2086
BUILD_LOG="$out/build.log" tools/gpu/build.sh loom loom_bench $tests || { tail -30 "$out/build.log"; exit 1; }
[ "${LOOM_MOE_TESTS:-1}" = 1 ] && ctest --test-dir build-gpu -R "Grouped|Moe|MoE|moe|Nf4|AttentionCuda|FlashKernels|LongLivedPool|LeafGradients|CheckpointInputs|DequantScratch|EmbeddingCuda" \
  -j4 --timeout 300 --output-on-failure \
  > "$out/ctest.txt" 2>&1
[ "${LOOM_MOE_TESTS:-1}" = 1 ] && tail -4 "$out/ctest.txt"
LOOM_MOE_PEERS=${LOOM_MOE_PEERS- } LOOM_MOE_MODES=${LOOM_MOE_MODES-none recompute} \
  LOOM_MOE_QLORA_MODES=${LOOM_MOE_QLORA_MODES-offload} OUT="$out" bash bench/e2e/moe.sh "${LOOM_MOE_SHAPE:-qwen3moe_smoke}" \
  > /dev/null 2>&1
cat "$out/moe_table.md" 2> /dev/null | grep '^|'
if [ "${LOOM_MOE_PROFILE:-0}" = 1 ]; then
  prof=$(mktemp)  # a LOOM_BIN that profiles the loom run it is given into $prof_out
  cat > "$prof" <<'SH'
#!/usr/bin/env bash
STEPS=3 SKIP=1 TOP=40 tools/gpu/kernel_profile.sh "$prof_out.csv" build-gpu/tools/loom "$@" > "$prof_out" 2>&1
SH
  chmod +x "$prof"
  for row in ${LOOM_MOE_PROFILE_ROWS:-none qlora-offload}; do  # [qlora-]mode: 4 steps, the first left out
    mode=${row#qlora-} lora=" " qlora=" "
    if [ "$row" = "$mode" ]; then lora=$mode; else qlora=$mode; fi
    prof_out="$out/profile_${row//-/_}.txt" LOOM_BIN=$prof LOOM_MOE_STEPS=4 LOOM_MOE_PEERS=" " LOOM_MOE_MODES=$lora \
      LOOM_MOE_QLORA_MODES=$qlora OUT=$(mktemp -d) bash bench/e2e/moe.sh "${LOOM_MOE_SHAPE:-qwen3moe_smoke}" > /dev/null 2>&1
    head -14 "$out/profile_${row//-/_}.txt"
  done
  rm -f "$out"/profile_*.txt.csv "$prof"
fi
[ "${LOOM_MOE_BENCH:-1}" = 1 ] || exit 0
build-gpu/bench/loom_bench --benchmark_filter='grouped_gemm/bf16/qwen3_30b_a3b/|nf4_dequantize_experts' \
  --benchmark_min_time=0.05 2>&1 | grep manual_time | awk '{print $1, $2, $3}' \
  | sed 's#grouped_gemm/bf16/qwen3_30b_a3b/##; s#/manual_time##' > "$out/grouped.txt"
paste - - - < "$out/grouped.txt"  # (no `column` on the GPU machine)
