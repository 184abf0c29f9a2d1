// LoRA on mixture-of-experts projections (models/lora_experts.h).
#include "models/lora_experts.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "models/lora.h"

namespace loom::detail {
namespace {

// Loom's B [E, out, r] -> PEFT's [out, r E] (column j E + e = expert e's column j), and back.
Tensor b_to_peft(const Tensor& b) {
  const int64_t experts = b.size(0), out = b.size(1), r = b.size(2);
  return b.transpose(0, 2).transpose(0, 1).contiguous().reshape({out, r * experts});  // [out, r, E]
}
Tensor b_from_peft(const Tensor& b, int64_t experts) {
  const int64_t out = b.size(0), r = b.size(1) / experts;
  return b.reshape({out, r, experts}).transpose(0, 2).transpose(1, 2).contiguous();  // [E, out, r]
}

void attach(ExpertLinear& p, Tensor a, Tensor b, const LoraConfig& c) {
  auto lora = std::make_unique<LoraAdapter>();
  lora->A = ag::Variable(std::move(a), true);
  lora->B = ag::Variable(std::move(b), true);
  lora->scale = c.scale_for(p.name);
  p.lora = std::move(lora);
}

}  // namespace

bool expert_targeted(const std::string& name, const LoraConfig& c) {
  for (const std::string& t : c.target_parameters)
    if (name == t || (name.size() > t.size() && name.ends_with("." + t))) return true;
  return false;
}

absl::Status add_expert_lora(CausalLM& model, const LoraConfig& c, uint64_t seed, int* matched) {
  uint64_t index = 0;
  for (ExpertLinear* p : model.expert_linears()) {
    ++index;
    if (!expert_targeted(p->name, c)) continue;
    if (c.dropout > 0)
      return absl::InvalidArgumentError(absl::StrCat("LoRA dropout ", c.dropout, " on the experts (", p->name,
                                                     "): PEFT's LoRA on expert parameters has no dropout; use 0"));
    const int64_t r = c.rank_for(p->name);
    if (r > std::max(p->in, p->out))
      return absl::InvalidArgumentError(absl::StrCat("LoRA r ", r, " exceeds both sides of ", p->name, " (in ", p->in,
                                                     ", out ", p->out, ")"));
    const DType adapter = model.precision().adapter;
    // PEFT: lora_A = Linear(in, r E) with kaiming_uniform_(a = sqrt(5)): U(+-1/sqrt(in)) for every row.
    Tensor a = Tensor::empty({p->experts, r, p->in}, adapter, model.device_of(p->name));
    const float bound = 1.f / std::sqrt(static_cast<float>(p->in));
    ops::uniform_(a, seed, (index << 32) | (1ULL << 31), -bound, bound);
    attach(*p, a, Tensor::zeros({p->experts, p->out, r}, adapter, model.device_of(p->name)), c);
    ++*matched;
  }
  return absl::OkStatus();
}

std::string peft_expert_module(const CausalLM& model, const ExpertLinear& proj) {
  const std::string module = proj.name.substr(0, proj.name.rfind('.'));  // "model.layers.3.mlp.experts"
  if (!proj.name.ends_with(".gate_up_proj")) return module;
  for (const ExpertLinear* other : model.expert_linears())
    if (other != &proj && other->lora && other->name.starts_with(module + ".")) return module + ".base_layer";
  return module;
}

std::vector<std::pair<std::string, Tensor>> peft_expert_tensors(const CausalLM& model, bool grads) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const ExpertLinear* p : model.expert_linears()) {
    if (!p->lora) continue;
    const std::string module = peft_expert_module(model, *p);
    const Tensor a = grads ? p->lora->A.grad() : p->lora->A.value();
    const Tensor b = grads ? p->lora->B.grad() : p->lora->B.value();
    out.emplace_back(peft_tensor_name(module, true), a.defined() ? a.reshape({p->experts * a.size(1), p->in}) : a);
    out.emplace_back(peft_tensor_name(module, false), b.defined() ? b_to_peft(b) : b);
  }
  return out;
}

absl::Status load_expert_lora(CausalLM& model, const LoraConfig& c, const ReadAdapterTensor& read) {
  // Which projections are adapted decides PEFT's nesting, hence the names: mark them first.
  std::vector<ExpertLinear*> targeted;
  for (ExpertLinear* p : model.expert_linears())
    if (expert_targeted(p->name, c)) {
      targeted.push_back(p);
      p->lora = std::make_unique<LoraAdapter>();  // its factors follow
    }
  for (ExpertLinear* p : targeted) {
    const std::string module = peft_expert_module(model, *p);
    const int64_t r = c.rank_for(p->name);
    auto a = read(peft_tensor_name(module, true), {r * p->experts, p->in});
    if (!a.ok()) return a.status();
    auto b = read(peft_tensor_name(module, false), {p->out, r * p->experts});
    if (!b.ok()) return b.status();
    attach(*p, a->reshape({p->experts, r, p->in}), b_from_peft(*b, p->experts), c);
  }
  return absl::OkStatus();
}

void merge_expert_lora(CausalLM& model) {
  for (ExpertLinear* p : model.expert_linears()) {
    if (!p->lora && !p->quantized()) continue;
    const DType dtype = p->quantized() ? model.dtype() : p->weight.dtype();
    p->scratch.reset();  // w is changed and kept below: a tensor of its own, not the shared buffer
    Tensor w = p->dense_weight(DType::f32);
    p->nf4.clear();
    if (p->lora) {
      const Tensor a = p->lora->A.value().to(DType::f32), b = p->lora->B.value().to(DType::f32);
      for (int64_t e = 0; e < p->experts; ++e) {  // W[e] += scale B_e [out, r] A_e [r, in], in f32
        Tensor we = w.narrow(0, e, 1).reshape({p->out, p->in});
        ops::matmul_into(b.narrow(0, e, 1).reshape({p->out, b.size(2)}), a.narrow(0, e, 1).reshape({a.size(1), p->in}), we,
                         false, false, p->lora->scale, 1.f);
      }
      p->lora.reset();
    }
    p->weight = ag::Variable(w.to(dtype), false);
  }
}

}  // namespace loom::detail
