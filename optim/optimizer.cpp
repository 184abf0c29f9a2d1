// The Optimizer (see optimizer.h): groups, master weights, step and named state.
#include "optim/optimizer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/error.h"
#include "optim/host_update.h"

namespace loom::optim {

namespace {
// Where an f32 parameter is its own master (kDevice) the master is the value itself.
bool separate_master(const Optimizer::Param& p) { return p.master.storage() != p.var.value().storage(); }
}  // namespace

Optimizer::Optimizer(std::unique_ptr<UpdateRule> rule, bool sharded, Placement placement)
    : rule_(std::move(rule)), sharded_(sharded), placement_(placement) {
  LOOM_CHECK(rule_ != nullptr, "Optimizer: null update rule");
  if (offloaded()) {
    for (auto& [name, t] : rule_->shared_state())
      LOOM_CHECK(t.is_cpu(), "Optimizer: CPU offload runs the ", rule_->name(), " rule on the host, but its ", name,
                 " is ", t.str(), " (make the rule for Device::cpu())");
    host_ = std::make_unique<HostUpdater>();
  }
}

Optimizer::~Optimizer() = default;

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
  if (offloaded()) {
    p.master = pinned_copy(var.value(), DType::f32);
  } else {
    p.master = var.dtype() == DType::f32 ? var.value() : var.value().to(DType::f32);
  }
  for (auto& [state_name, t] : rule_->init_state(p.master.numel(), p.master.device())) {
    p.state_names.push_back(state_name);
    p.state.push_back(offloaded() ? pinned_copy(t, t.dtype()) : std::move(t));
  }
  params_.push_back(std::move(p));
}

void Optimizer::step(float lr, float grad_scale) {
  LOOM_CHECK(!sharded_, "Optimizer::step on a sharded optimizer: dist::Zero2 steps its shard");
  if (offloaded()) return step_on_host(lr, grad_scale);
  step_on_device(lr, grad_scale, nullptr);
}

void Optimizer::step(float lr, const Tensor& grad_scale) {
  LOOM_CHECK(!sharded_, "Optimizer::step on a sharded optimizer: dist::Zero2 steps its shard");
  LOOM_CHECK(grad_scale.numel() == 1 && grad_scale.dtype() == DType::f32, "Optimizer::step: the gradient scale must ",
             "be one f32 value, got ", grad_scale.str());
  bool in_place = !offloaded() && rule_->reads_grad_scale_at();
  for (const Param& p : params_)
    if (p.var.grad().defined() && p.master.device() != grad_scale.device()) in_place = false;
  if (!in_place) return step(lr, static_cast<float>(grad_scale.to_doubles()[0]));
  const Tensor scale = grad_scale.contiguous();
  step_on_device(lr, 1.f, &scale);
}

void Optimizer::step_on_device(float lr, float grad_scale, const Tensor* grad_scale_at) {
  std::vector<UpdateRule::Item> items;
  std::vector<Tensor> computes;  // the compute copies items point into (no reallocation below)
  computes.reserve(params_.size());
  for (Param& p : params_) {
    const Tensor& grad = p.var.grad();
    if (!grad.defined()) continue;
    const ParamGroup& g = groups_[p.group];
    StepArgs a;
    a.lr = lr * g.lr_scale;
    a.weight_decay = g.weight_decay;
    a.grad_scale = grad_scale;
    if (grad_scale_at) a.grad_scale_at = grad_scale_at->data<float>();
    a.step = ++p.step;
    computes.push_back(p.var.value());
    const bool separate = p.master.storage() != computes.back().storage();
    items.push_back({&p.master, &grad, &p.state, a, separate ? &computes.back() : nullptr});
  }
  rule_->update_many(items);
}

void Optimizer::step_on_host(float lr, float grad_scale) {
  std::vector<HostRange> ranges;
  for (Param& p : params_) {
    const Tensor& grad = p.var.grad();
    if (!grad.defined()) continue;
    const ParamGroup& g = groups_[p.group];
    HostRange r;
    r.master = p.master.reshape({-1});
    r.state = &p.state;
    r.grad = grad.reshape({-1});
    r.compute = p.var.value().reshape({-1});
    r.args.lr = lr * g.lr_scale;
    r.args.weight_decay = g.weight_decay;
    r.args.grad_scale = grad_scale;
    r.args.step = ++p.step;
    ranges.push_back(std::move(r));
  }
  host_->run(*rule_, ranges);
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
    if (all_masters || p.var.dtype() != DType::f32) out["master." + p.name] = p.master;
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
    if (p.var.dtype() != DType::f32 || tensors.contains("master." + p.name)) {
      auto t = find("master." + p.name, p.master);
      if (!t.ok()) return t.status();
      p.master.copy_(t->reshape(p.master.shape()));
      if (separate_master(p)) {
        Tensor compute = p.var.value();
        compute.copy_(p.master);  // compute weights are the master rounded once
      }
    } else if (separate_master(p)) {
      p.master.copy_(p.var.value());  // saved without masters (LoRA): the loaded f32 value is the master
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

int64_t Optimizer::master_bytes() const {
  int64_t n = 0;
  for (const Param& p : params_)
    if (p.master.defined() && p.var.dtype() != DType::f32) n += p.master.nbytes();
  return n;
}

int64_t Optimizer::staging_bytes() const { return host_ ? host_->staging_bytes() : 0; }

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (auto& [name, t] : rule_->shared_state()) n += t.nbytes();
  for (const Param& p : params_)
    for (const Tensor& t : p.state) n += t.nbytes();
  return n;
}

}  // namespace loom::optim
