// ToyLlama: a small, randomly initialised Llama-style decoder (RMSNorm, grouped-query attention
// with RoPE, SwiGLU) built directly from autograd functions, with an AdamW optimizer. It exercises
// every op of a training step for the demo and the foundation tests; the Hugging Face families
// (llama.h, qwen.h, gemma.h) are the real models.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/functions.h"
#include "kernels/adamw.h"
#include "kernels/rope.h"
#include "optim/optimizer.h"

namespace loom {

struct ToyLlamaConfig {
  int64_t vocab_size = 64;
  int64_t hidden_size = 32;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 8;
  int64_t intermediate_size = 64;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  uint64_t seed = 0;
};

class ToyLlama {
 public:
  // Master weights in f32 on device; forward computes in compute_dtype (f32 or bf16).
  ToyLlama(const ToyLlamaConfig& config, Device device, DType compute_dtype);

  // ids, targets: i32 [batch, seq] on the model's device; returns the mean next-token loss
  // (targets already shifted by the caller; -100 ignored).
  ag::Variable loss(const Tensor& ids, const Tensor& targets);
  // One AdamW step (torch semantics) on every weight, then clears the gradients. The optimizer is
  // made on the first call from its betas, eps and weight decay; later calls set lr and grad_scale.
  void step(const AdamWParams& params);
  optim::Optimizer* optimizer() { return optimizer_.get(); }

  std::vector<ag::Variable>& parameters() { return params_; }
  int64_t num_parameters() const;

 private:
  struct Layer {
    size_t input_norm, q, k, v, o, post_norm, gate, up, down;  // indices into params_
  };
  ag::Variable weight(size_t index);  // the compute-dtype view of a master weight
  size_t add_param(const Shape& shape, bool is_norm);

  ToyLlamaConfig config_;
  Device device_;
  DType compute_dtype_;
  std::vector<ag::Variable> params_;
  std::vector<Layer> layers_;
  size_t embed_ = 0, final_norm_ = 0, lm_head_ = 0;
  Tensor inv_freq_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace loom
