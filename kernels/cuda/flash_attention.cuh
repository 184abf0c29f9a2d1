// Flash attention for bf16 on sm_80+ tensor cores (mma.sync), behind kernels/attention.h: the
// S x S matrix is never stored; the forward saves out and the log-sum-exp, the backward recomputes
// the probabilities tile by tile. attention.cu routes bf16 calls here when flash_supported().
#pragma once
#include <cstddef>

#include "kernels/attention.h"

namespace loom::cuda::flash {

// scale > 0, head_dim a multiple of 8 up to 256, and every pointer 16-byte aligned (rows are then too).
bool supported(const AttentionParams& p, const void* q, const void* k, const void* v, const void* out);

void forward(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, Stream s);

// Workspace: D_i = dout_i . out_i per (batch, head, query) and an f32 dq accumulator.
size_t backward_workspace_bytes(const AttentionParams& p);
void backward(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
              const bf16* dout, const float* lse, bf16* dq, bf16* dk, bf16* dv, void* workspace, Stream s);

}  // namespace loom::cuda::flash
