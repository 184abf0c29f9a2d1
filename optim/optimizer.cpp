// The Optimizer (see optimizer.h): groups, master weights, step and named state.
#include "optim/optimizer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/error.h"

namespace loom::optim {

Optimizer::Optimizer(std::unique_ptr<UpdateRule> rule, bool sharded) : rule_(std::move(rule)), sharded_(sharded) {
  LOOM_CHECK(rule_ != nullptr, "Optimizer: null update rule");
}

int Optimizer::add_group(ParamGroup group) {
  groups_.push_back(std::move(group));
  return static_cast<int>(groups_.size()) - 1;
}

void Optimizer::add_param(const std::string& name, const ag::Variable& var, int group) {
  LOOM_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "Optimizer::add_param(", name, "): group ",
             group, " does not exist (", groups_.size(), " groups; call add_group first)");
  LOOM_CHECK(var.requires_grad() && var.is_leaf(), "Optimizer::add_param(", name, "): not a leaf that requires grad");
  LOOM_CHECK(var.value().is_contiguous(), "Optimizer::add_param(", name, "): value must be contiguous, got ",
             var.value().str());
  LOOM_CHECK(var.dtype() == DType::f32 || var.dtype() == DType::bf16, "Optimizer::add_param(", name,
             "): value must be f32 or bf16, got ", var.value().str());
  for (const Param& p : params_) LOOM_CHECK(p.name != name, "Optimizer::add_param: duplicate name ", name);
  Param p;
  p.name = name;
  p.var = var;
  p.group = group;
  if (sharded_) {  // the shard owner allocates masters and state for its piece
    params_.push_back(std::move(p));
    return;
  }
  p.master = var.dtype() == DType::f32 ? var.value() : var.value().to(DType::f32);
  for (auto& [state_name, t] : rule_->init_state(p.master.numel(), p.master.device())) {
    p.state_names.push_back(state_name);
    p.state.push_back(std::move(t));
  }
  params_.push_back(std::move(p));
}

void Optimizer::step(float lr, float grad_scale) {
  LOOM_CHECK(!sharded_, "Optimizer::step on a sharded optimizer: dist::Zero2 steps its shard");
  for (Param& p : params_) {
    const Tensor& grad = p.var.grad();
    if (!grad.defined()) continue;
    const ParamGroup& g = groups_[p.group];
    StepArgs a;
    a.lr = lr * g.lr_scale;
    a.weight_decay = g.weight_decay;
    a.grad_scale = grad_scale;
    a.step = ++p.step;
    Tensor compute = p.var.value();
    const bool separate = p.master.storage() != compute.storage();
    rule_->update(p.master, grad, p.state, a, separate ? &compute : nullptr);
  }
}

void Optimizer::zero_grad() {
  for (Param& p : params_) p.var.zero_grad();
}

std::map<std::string, Tensor> Optimizer::state_dict(bool all_masters) const {
  LOOM_CHECK(!sharded_, "Optimizer::state_dict on a sharded optimizer: dist::Zero2 holds the state");
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : rule_->shared_state()) out[name] = t;
  for (const Param& p : params_) {
    for (size_t i = 0; i < p.state.size(); ++i) out[p.state_names[i] + "." + p.name] = p.state[i];
    if (all_masters || p.master.storage() != p.var.value().storage()) out["master." + p.name] = p.master;
    Tensor step = Tensor::zeros({1}, DType::i64);
    *step.data<int64_t>() = p.step;
    out["step." + p.name] = step;
  }
  return out;
}

absl::Status Optimizer::load_state_dict(const std::map<std::string, Tensor>& tensors, const std::string& where,
                                       int64_t default_step) {
  LOOM_CHECK(!sharded_, "Optimizer::load_state_dict on a sharded optimizer: dist::Zero2 holds the state");
  if (absl::Status s = rule_->load_shared_state(tensors, where); !s.ok()) return s;
  auto find = [&](const std::string& key, const Tensor& like) -> absl::StatusOr<Tensor> {
    auto it = tensors.find(key);
    if (it == tensors.end()) return absl::DataLossError(absl::StrCat(where, ": missing optimizer tensor ", key));
    if (it->second.numel() != like.numel() || it->second.dtype() != like.dtype())
      return absl::DataLossError(absl::StrCat(where, ": optimizer tensor ", key, " is ", it->second.str(),
                                              ", expected ", like.str()));
    return it->second;
  };
  for (Param& p : params_) {
    for (size_t i = 0; i < p.state.size(); ++i) {
      auto t = find(p.state_names[i] + "." + p.name, p.state[i]);
      if (!t.ok()) return t.status();
      p.state[i].copy_(t->reshape(p.state[i].shape()));
    }
    const bool separate = p.master.storage() != p.var.value().storage();
    if (separate || tensors.contains("master." + p.name)) {
      auto t = find("master." + p.name, p.master);
      if (!t.ok()) return t.status();
      p.master.copy_(t->reshape(p.master.shape()));
      if (separate) {
        Tensor compute = p.var.value();
        compute.copy_(p.master);  // compute weights are the master rounded once
      }
    }
    if (default_step >= 0 && !tensors.contains("step." + p.name)) {
      p.step = default_step;  // written before per-parameter steps were saved
      continue;
    }
    auto step = find("step." + p.name, Tensor::zeros({1}, DType::i64));
    if (!step.ok()) return step.status();
    p.step = *step->contiguous().data<int64_t>();
  }
  return absl::OkStatus();
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (auto& [name, t] : rule_->shared_state()) n += t.nbytes();
  for (const Param& p : params_)
    for (const Tensor& t : p.state) n += t.nbytes();
  return n;
}

}  // namespace loom::optim
