// ToyLlama (see toy_llama.h).
#include "models/toy_llama.h"

#include "optim/adamw.h"

namespace loom {

ToyLlama::ToyLlama(const ToyLlamaConfig& config, Device device, DType compute_dtype)
    : config_(config), device_(device), compute_dtype_(compute_dtype) {
  const auto& c = config_;
  LOOM_CHECK(c.num_heads % c.num_kv_heads == 0, "ToyLlama: heads ", c.num_heads, " not a multiple of kv heads ",
             c.num_kv_heads);
  embed_ = add_param({c.vocab_size, c.hidden_size}, false);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer L;
    L.input_norm = add_param({c.hidden_size}, true);
    L.q = add_param({c.num_heads * c.head_dim, c.hidden_size}, false);
    L.k = add_param({c.num_kv_heads * c.head_dim, c.hidden_size}, false);
    L.v = add_param({c.num_kv_heads * c.head_dim, c.hidden_size}, false);
    L.o = add_param({c.hidden_size, c.num_heads * c.head_dim}, false);
    L.post_norm = add_param({c.hidden_size}, true);
    L.gate = add_param({c.intermediate_size, c.hidden_size}, false);
    L.up = add_param({c.intermediate_size, c.hidden_size}, false);
    L.down = add_param({c.hidden_size, c.intermediate_size}, false);
    layers_.push_back(L);
  }
  final_norm_ = add_param({c.hidden_size}, true);
  lm_head_ = add_param({c.vocab_size, c.hidden_size}, false);
  inv_freq_ = ops::rope_inv_freq(c.head_dim, c.rope_theta, device_);
}

size_t ToyLlama::add_param(const Shape& shape, bool is_norm) {
  Tensor t = Tensor::empty(shape, DType::f32, device_);
  if (is_norm) {
    ops::fill_(t, 1.f);
  } else {  // N(0, 0.02) from the counter-based RNG: the same weights on CPU and CUDA
    ops::normal_(t, config_.seed, /*offset=*/params_.size() << 32, 0.f, 0.02f);
  }
  params_.emplace_back(t, true);
  return params_.size() - 1;
}

ag::Variable ToyLlama::weight(size_t index) { return ag::cast(params_[index], compute_dtype_); }

int64_t ToyLlama::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value().numel();
  return n;
}

ag::Variable ToyLlama::loss(const Tensor& ids, const Tensor& targets) {
  const auto& c = config_;
  LOOM_CHECK(ids.dim() == 2 && targets.shape() == ids.shape(), "ToyLlama::loss: ids ", ids.str(), " and targets ",
             targets.str(), " must both be [batch, seq]");
  const int64_t batch = ids.size(0), seq = ids.size(1);
  std::vector<int32_t> pos(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) pos[i] = static_cast<int32_t>(i % seq);
  const Tensor positions = Tensor::from_ints(pos, {batch * seq}).to(device_);

  ag::Variable x = ag::embedding(ids, weight(embed_));  // [batch, seq, hidden]
  for (const Layer& L : layers_) {
    ag::Variable h = ag::rms_norm(x, weight(L.input_norm), c.rms_norm_eps);
    ag::Variable q = ag::reshape(ag::linear(h, weight(L.q)), {batch, seq, c.num_heads, c.head_dim});
    ag::Variable k = ag::reshape(ag::linear(h, weight(L.k)), {batch, seq, c.num_kv_heads, c.head_dim});
    ag::Variable v = ag::reshape(ag::linear(h, weight(L.v)), {batch, seq, c.num_kv_heads, c.head_dim});
    q = ag::rope(q, positions, inv_freq_);
    k = ag::rope(k, positions, inv_freq_);
    ag::Variable a = ag::attention(q, k, v, ops::AttentionOptions{});
    a = ag::reshape(a, {batch, seq, c.num_heads * c.head_dim});
    x = ag::add(x, ag::linear(a, weight(L.o)));
    h = ag::rms_norm(x, weight(L.post_norm), c.rms_norm_eps);
    ag::Variable m = ag::swiglu(ag::linear(h, weight(L.gate)), ag::linear(h, weight(L.up)));
    x = ag::add(x, ag::linear(m, weight(L.down)));
  }
  x = ag::rms_norm(x, weight(final_norm_), c.rms_norm_eps);
  ag::Variable logits = ag::reshape(ag::linear(x, weight(lm_head_)), {batch * seq, c.vocab_size});
  return ag::cross_entropy(logits, targets.reshape({batch * seq}));
}

void ToyLlama::step(const AdamWParams& params) {
  if (!optimizer_) {
    optimizer_ = std::make_unique<optim::Optimizer>(optim::make_adamw({params.beta1, params.beta2, params.eps}));
    const int group = optimizer_->add_group({"all", 1.f, params.weight_decay});
    for (size_t i = 0; i < params_.size(); ++i) optimizer_->add_param("param." + std::to_string(i), params_[i], group);
  }
  optimizer_->step(params.lr, params.grad_scale);
  optimizer_->zero_grad();
}

}  // namespace loom
