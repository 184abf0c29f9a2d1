// CPU optimizer offload: an UpdateRule run on the host over ranges whose f32 masters and state live
// in pinned host memory while their gradients and compute weights live on a GPU. Gradients come
// down on a side stream, the update runs on the CPU (the rule's CPU kernels, OpenMP) chunk by chunk
// as its gradients arrive, and each chunk's new weights go up on another side stream in the compute
// dtype while the next chunk is updated. The Optimizer (placement kHost) and dist::Zero2 use it.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "engine/transfer.h"
#include "optim/optimizer.h"

namespace loom::optim {

struct HostRange {
  Tensor master;               // f32, contiguous, host (pinned: uploaded directly when compute is f32)
  std::vector<Tensor>* state;  // the rule's state for master, on the host
  Tensor grad;                 // f32 or bf16, master's numel, contiguous, any device
  Tensor compute;              // receives the new weights: f32 or bf16, master's numel, contiguous, any device
  StepArgs args;
};

class HostUpdater {
 public:
  // Updates every range (gradients read, masters, state and compute weights written). Returns once
  // the host work is done; the compute stream is ordered after the uploads.
  void run(UpdateRule& rule, std::vector<HostRange>& ranges);
  // Pinned bytes of the gradient and weight staging buffers.
  int64_t staging_bytes() const;

 private:
  Tensor stage(std::map<DType, Tensor>& buffers, DType dtype, int64_t numel);
  std::map<DType, Tensor> grad_stage_, out_stage_;  // per dtype, grown as needed
  TransferEvent uploaded_;                          // the last run's final upload
};

// Pinned host copy of t (same shape, dtype; any source device).
Tensor pinned_copy(const Tensor& t, DType dtype);

}  // namespace loom::optim
