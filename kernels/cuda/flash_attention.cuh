// Flash attention for bf16 on sm_80+ tensor cores, behind kernels/attention.h: the S x S matrix is
// never stored; the forward saves out and the log-sum-exp, the backward recomputes the
// probabilities tile by tile. attention.cu routes bf16 calls here when supported(); forward() and
// backward() (flash_attention.cu) pick a kernel by architecture and shape. Host C++ only, so that
// bench/ and tests can name a kernel.
#pragma once
#include <cstddef>

#include "kernels/attention.h"

namespace loom::cuda::flash {

// scale > 0, head_dim a multiple of 8 up to 256, and every pointer 16-byte aligned (rows are then too).
bool supported(const AttentionParams& p, const void* q, const void* k, const void* v, const void* out);

// The kernels. kAuto is what forward() and backward() choose (flash_attention.cu says why, with
// the measurements); bench/ and tests name the others to compare them with one another.
enum class Kernel {
  kAuto,
  kMma,     // mma.sync m16n8k16 (flash_attention_{fwd,bwd}.cu): sm_80 and up, every supported shape
  kSm90,    // wgmma, every thread loads (flash_attention_{fwd,bwd}_sm90*.cu): sm_90a, every feature;
            // the backward at head_dim <= 128 (and 129..256 in flash_attention_bwd_sm90_d256.cu)
  kSm90Ws,  // warp-specialised TMA + wgmma (*_sm90_ws.cu): sm_90a; causal with or without a
            // window (no soft-cap or segments), forward at head_dim 64..256, backward at 64..128
  kSm90WsPersistent,  // the sm90_ws forward launched with one block per SM walking the query
                      // tiles (FlashAttention-3's persistent schedule); forward only
};
const char* kernel_name(Kernel kernel);
// Whether `kernel` runs p's forward (backward = false) or backward on the current device.
bool runs(Kernel kernel, const AttentionParams& p, bool backward);
// The kernel kAuto stands for.
Kernel forward_kernel(const AttentionParams& p);
Kernel backward_kernel(const AttentionParams& p);

// A named kernel that cannot run p throws loom::Error.
void forward(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, Stream s,
             Kernel kernel = Kernel::kAuto);
// Workspace: D_i = dout_i . out_i per (batch, head, query) and an f32 dq accumulator.
size_t backward_workspace_bytes(const AttentionParams& p);
// rope_q (whole-head rotation: rotary_dim == head_dim): dq leaves through rope's backward, in the pass
// that scales and rounds it.
void backward(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
              const bf16* dout, const float* lse, bf16* dq, bf16* dk, bf16* dv, void* workspace, Stream s,
              Kernel kernel = Kernel::kAuto, const RopeOfQ* rope_q = nullptr);

// ---- the kernels' launchers (forward() and backward() check what they need) ----
// mma.sync (flash_attention_fwd.cu, flash_attention_bwd.cu).
void forward_mma(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                 Stream s);
// The backward kernels take dsum (D_i) and dq_acc as backward() prepares them (dq_acc zeroed; the
// caller scales and rounds it into dq afterwards).
void backward_mma(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                  const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s);

// Hopper kernels: sm90_ready() says whether the current device is compute capability 9.0 and the
// binary holds sm_90a machine code for them (asked once per device, with a synchronous probe launch).
bool sm90_ready();
// Two warpgroups of 64 query rows per block; 128 keys per step (64 at head_dim 256).
void forward_sm90(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                  Stream s);
// Warp-specialised forward: a TMA producer warpgroup and two ping-ponging consumer warpgroups.
// sm90_ws_supported: causal attention, windowed or not (no soft-cap or segments), head_dim 64 to 256.
bool sm90_ws_supported(const AttentionParams& p);
// How blocks that walk query tiles take them: blockIdx.x, blockIdx.x + gridDim.x, ... (round robin),
// or the next from a counter kept for the launch's stream on this device as a block nears the end
// of its last (dynamic). kAuto: dynamic where it measured faster (ws_dynamic_pays).
enum class TileOrder { kAuto, kRoundRobin, kDynamic };
// blocks: 0 for a block per query tile; else that many blocks (at most one per tile), each walking
// the tiles in `order` (kSm90WsPersistent: one per SM; the tests take fewer, so that each block
// walks many).
void forward_sm90_ws(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                     Stream s, int64_t blocks = 0, TileOrder order = TileOrder::kAuto);
// Whether kAuto walks p's query tiles of `rows` rows dynamically.
bool ws_dynamic_pays(const AttentionParams& p, int64_t rows);
// The wgmma backward for head_dim <= 128 (flash_attention_bwd_sm90.cu): dQ added with atomics.
void backward_sm90(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                   const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s);
// The wgmma backward for head_dim 129..256 (flash_attention_bwd_sm90_d256.cu): the two warpgroups
// split head_dim for dK, dV and dQ; dQ added with atomics.
void backward_sm90_d256(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                        const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s);
// Warp-specialised backward (flash_attention_bwd_sm90_ws.cu): a TMA producer warp, a dQ-writer warp
// (tensor reductions) and two wgmma consumer warpgroups. sm90_ws_bwd_supported: causal,
// windowed or not, at head_dim 64 to 256 (129..256: backward_sm90_ws_d256).
bool sm90_ws_bwd_supported(const AttentionParams& p);
void backward_sm90_ws(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                      const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s);
// Its head_dim 129..256 kernel (flash_attention_bwd_sm90_ws_d256.cu): the consumers split head_dim
// for dK, dV and dQ as backward_sm90_d256's warpgroups do, dQ leaves by tensor reductions.
void backward_sm90_ws_d256(const AttentionParams& p, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                           const float* lse, const float* dsum, float* dq_acc, bf16* dk, bf16* dv, Stream s);

}  // namespace loom::cuda::flash
