// torch.optim.AdamW as an UpdateRule, and the rule factory (see adamw.h).
#include "optim/adamw.h"

#include "absl/strings/str_cat.h"
#include "engine/ops.h"
#include "kernels/adamw.h"

namespace loom::optim {
namespace {

class AdamW : public UpdateRule {
 public:
  explicit AdamW(const AdamConfig& c) : c_(c) {}
  std::string name() const override { return "adamw"; }
  bool reads_grad_scale_at() const override { return true; }
  std::vector<std::pair<std::string, Tensor>> init_state(int64_t numel, Device device) const override {
    return {{"exp_avg", Tensor::zeros({numel}, DType::f32, device)},
            {"exp_avg_sq", Tensor::zeros({numel}, DType::f32, device)}};
  }
  void update(Tensor& master, const Tensor& grad, std::vector<Tensor>& state, const StepArgs& a,
              Tensor* compute) override {
    LOOM_CHECK(state.size() == 2, "adamw update: expected 2 state tensors, got ", state.size());
    const AdamWParams p = adamw_params(c_, a);
    const bool bf16_copy = compute && compute->dtype() == DType::bf16;
    ops::adamw_step(master, grad, state[0], state[1], p, bf16_copy ? compute : nullptr);
    if (compute && !bf16_copy) compute->copy_(master);
  }
  void update_many(std::vector<Item>& items) override {
    std::vector<AdamWParams> params;
    params.reserve(items.size());  // (steps point into it)
    std::vector<ops::AdamWItem> steps;
    for (Item& it : items) {
      LOOM_CHECK(it.state->size() == 2, "adamw update: expected 2 state tensors, got ", it.state->size());
      const bool bf16_copy = it.compute && it.compute->dtype() == DType::bf16;
      params.push_back(adamw_params(c_, it.args));
      steps.push_back({it.master, it.grad, &(*it.state)[0], &(*it.state)[1], &params.back(),
                       bf16_copy ? it.compute : nullptr});
    }
    ops::adamw_step_many(steps);
    for (Item& it : items)
      if (it.compute && it.compute->dtype() != DType::bf16) it.compute->copy_(*it.master);
  }

 private:
  AdamConfig c_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_adamw(const AdamConfig& config) { return std::make_unique<AdamW>(config); }

absl::StatusOr<std::unique_ptr<UpdateRule>> make_update_rule(const std::string& name, const AdamConfig& config,
                                                              Device device) {
  if (name == "adamw") return make_adamw(config);
  if (name == "adamw8bit") return make_adamw8bit(config, device);
  return absl::InvalidArgumentError(absl::StrCat("--optim must be adamw or adamw8bit, got '", name, "'"));
}

}  // namespace loom::optim
