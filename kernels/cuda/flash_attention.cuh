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

// Hopper kernels (wgmma, flash_attention_*_sm90.cu): sm90_ready() says whether the current device is
// compute capability 9.0 and the binary holds sm_90a machine code for them (asked once, with a
// synchronous probe launch). forward_sm90: warpgroups (of 64 query rows) per block, 2 (128 keys per
// step, 32 at head_dim 256; one block per SM) or 1 (64 keys at head_dim 128; two blocks per SM).
bool sm90_ready();
void forward_sm90(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                  int warpgroups, Stream s);
// Warp-specialised Hopper forward (flash_attention_fwd_sm90_ws.cu, LOOM_FLASH_FWD=6): a TMA
// producer warpgroup and two ping-ponging consumer warpgroups. sm90_ws_supported: plain causal
// attention (no soft-cap, window or segments) at head_dim 64 to 128; forward() sends the rest to
// forward_sm90.
bool sm90_ws_supported(const AttentionParams& p);
void forward_sm90_ws(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                     Stream s);
// The backward's main kernel for head_dim <= 128 (flash_attention_bwd_sm90.cu); dsum and dq_acc as
// backward() prepares them (dq_acc zeroed; the caller scales and rounds it into dq afterwards).
// bulk_dq: dQ is added through shared memory with bulk reductions instead of atomics; overlap
// (implies bulk_dq; ignored under soft-capping): the exponentials overlap dP^T's product and dQ's
// addition dV, dK.
void backward_sm90(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                   const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, bool bulk_dq, bool overlap,
                   Stream s);

// Warp-specialised Hopper backward (flash_attention_bwd_sm90_ws.cu, LOOM_FLASH_BWD=6): a TMA
// producer warp, a dQ-writer warp (bulk reductions) and two wgmma consumer warpgroups; dsum and
// dq_acc as for backward_sm90. sm90_ws_bwd_supported: plain causal attention (no soft-cap, window
// or segments) at head_dim 64 to 128; backward() sends the rest to variant 3.
bool sm90_ws_bwd_supported(const AttentionParams& p);
void backward_sm90_ws(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                      const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s);

// Workspace: D_i = dout_i . out_i per (batch, head, query) and an f32 dq accumulator.
size_t backward_workspace_bytes(const AttentionParams& p);
void backward(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
              const bf16* dout, const float* lse, bf16* dq, bf16* dk, bf16* dv, void* workspace, Stream s);

}  // namespace loom::cuda::flash
