// WeightLoader (models/weight_loader.h).
#include "models/weight_loader.h"

#include "absl/strings/str_cat.h"

namespace loom::detail {

void WeightLoader::choose_layout() {
  if (!ck_) return;
  for (const FamilySpec::CheckpointLayout& l : family_.checkpoint_layouts)
    if (ck_->find(l.model_prefix + "embed_tokens.weight")) {
      layout_ = &l;
      return;
    }
}

std::string WeightLoader::checkpoint_name(const std::string& hf) const {
  if (!layout_) return hf;
  if (hf.starts_with("model.")) return layout_->model_prefix + hf.substr(6);
  if (hf.starts_with("lm_head.")) return layout_->lm_head_prefix + hf.substr(8);
  return hf;
}

absl::StatusOr<Tensor> WeightLoader::load_part(const HfSource& src, const Shape& shape) {
  if (fused_name_ != src.name) {
    Shape whole = shape;
    whole[0] = src.total_rows;
    auto t = ck_->load(src.name, dtype_, device_, whole);
    if (!t.ok()) return t.status();
    fused_ = *std::move(t);
    fused_name_ = src.name;
  }
  return fused_.narrow(0, src.row0, src.rows).contiguous().clone();
}

absl::StatusOr<ag::Variable> WeightLoader::get(const std::string& name, const Shape& shape, float init_fill) {
  if (!ck_) {
    Tensor t = Tensor::empty(shape, DType::f32, device_);
    if (std::isnan(init_fill)) ops::normal_(t, seed_, static_cast<uint64_t>(consumed_.size()) << 36, 0.f, 0.02f);
    else ops::fill_(t, init_fill);
    consumed_.insert(name);
    return ag::Variable(t.to(dtype_), false);
  }
  auto src = hf_source(family_, config_, name);
  if (!src.ok()) return src.status();
  src->name = checkpoint_name(src->name);
  auto t = src->part() ? load_part(*src, shape) : ck_->load(src->name, dtype_, device_, shape);
  if (!t.ok()) return t.status();
  if (!is_float(t->dtype()))  // an integer "weight" would only fail later, deep in a kernel
    return absl::InvalidArgumentError(absl::StrCat(ck_->file_of(src->name), ": tensor '", src->name, "' is ",
                                                   std::string(loom::name(t->dtype())), "; a weight must be a float ",
                                                   "tensor (f32, bf16, f16 or f64)"));
  consumed_.insert(src->name);
  return ag::Variable(*std::move(t), false);
}

absl::Status WeightLoader::linear(Linear& l, const std::string& name, int64_t out, int64_t in, bool bias,
                                  bool norm_reader) {
  l.name = name;
  const std::string wname = name + ".weight";
  auto src = ck_ ? hf_source(family_, config_, wname) : absl::StatusOr<HfSource>(HfSource{wname});
  if (!src.ok()) return src.status();
  src->name = checkpoint_name(src->name);
  if (ck_ && is_nf4(*ck_, src->name)) {  // stored in 4 bits by transformers + bitsandbytes: kept so
    if (src->part())
      return absl::UnimplementedError(absl::StrCat(ck_->file_of(src->name), ": '", src->name, "' is a fused 4-bit ",
                                                   "weight; Loom splits fused weights only from 16/32-bit checkpoints"));
    auto q = load_nf4(*ck_, src->name, {out, in}, device_);
    if (!q.ok()) return q.status();
    for (const auto& [n, t] : nf4_state_tensors(src->name, *q)) consumed_.insert(n);
    l.nf4 = std::make_shared<const Nf4Weight>(*std::move(q));
  } else {
    auto w = get(wname, {out, in});
    if (!w.ok()) return w.status();
    if (quantize_4bit_ && bnb_quantizes(src->name, bnb_ ? &*bnb_ : nullptr)) {
      // QLoRA from a full-precision checkpoint: only this one weight is ever dense on the device.
      l.nf4 = std::make_shared<const Nf4Weight>(Nf4Weight::quantize(w->value()));
    } else {
      l.weight = *std::move(w);
      if (norm_reader && adapter_room_ > 0) l.widen(adapter_room_);
    }
  }
  if (bias) {
    auto b = get(name + ".bias", {out}, 0.f);
    if (!b.ok()) return b.status();
    l.bias = *std::move(b);
  }
  return absl::OkStatus();
}

absl::StatusOr<ag::Variable> WeightLoader::experts(const std::vector<std::string>& parts, const std::vector<int64_t>& part_rows,
                                                   int64_t experts, int64_t cols, const std::string& fused) {
  int64_t rows = 0;
  for (int64_t r : part_rows) rows += r;
  const Shape shape{experts, rows, cols};
  if (!ck_) return get(fused, shape);
  if (const std::string name = checkpoint_name(fused); ck_->find(name)) {  // as transformers 5.x holds it
    auto t = ck_->load(name, dtype_, device_, shape);
    if (!t.ok()) return t.status();
    consumed_.insert(name);
    return ag::Variable(*std::move(t), false);
  }
  Tensor out = Tensor::empty(shape, dtype_, device_);
  for (int64_t e = 0; e < experts; ++e) {
    int64_t row = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      std::string name = parts[p];
      const size_t at = name.find("{e}");
      if (at != std::string::npos) name.replace(at, 3, std::to_string(e));
      name = checkpoint_name(name);
      if (!ck_->find(name))
        return absl::NotFoundError(absl::StrCat(ck_->dir(), ": no tensor '", name, "' (expert ", e, " of ", experts,
                                                "), nor the fused '", checkpoint_name(fused), "'"));
      auto t = ck_->load(name, dtype_, device_, {part_rows[p], cols});
      if (!t.ok()) return t.status();
      Tensor dst = out.narrow(0, e, 1).reshape({rows, cols}).narrow(0, row, part_rows[p]);
      dst.copy_(*t);
      consumed_.insert(name);
      row += part_rows[p];
    }
  }
  return ag::Variable(out, false);
}

absl::Status WeightLoader::moe(MoeMlp& m, const std::string& p) {
  const FamilySpec::MoeSpec& spec = *family_.moe;
  const MoeConfig& mc = config_.moe;
  const int64_t E = mc.experts, I = mc.expert_intermediate, H = config_.hidden_size;
  m.name = p + "mlp";
  m.top_k = mc.experts_per_token;
  m.renormalize = mc.renormalize;
  m.round_weights = spec.round_weights;
  auto router = get(p + "mlp.gate.weight", {E, H});
  if (!router.ok()) return router.status();
  m.router = *std::move(router);
  const std::string per_expert = absl::StrCat(p, spec.experts, ".{e}.");
  struct Part {
    ExpertLinear& proj;
    const char* name;
    std::vector<std::string> hf;
    std::vector<int64_t> rows;
    int64_t cols;
  };
  for (Part part : {Part{m.gate_up, "gate_up_proj", {per_expert + spec.gate + ".weight", per_expert + spec.up + ".weight"},
                         {I, I}, H},
                    Part{m.down, "down_proj", {per_expert + spec.down + ".weight"}, {H}, I}}) {
    ExpertLinear& x = part.proj;
    x.name = p + "mlp.experts." + part.name;
    x.experts = E, x.in = part.cols;
    x.out = 0;
    for (int64_t r : part.rows) x.out += r;
    auto w = experts(part.hf, part.rows, E, part.cols, x.name);
    if (!w.ok()) return w.status();
    if (quantize_4bit_) {  // QLoRA: each expert as bitsandbytes quantises a Linear weight [out, in]
      x.scratch = dequant_scratch_;
      for (int64_t e = 0; e < E; ++e)
        x.nf4.push_back(std::make_shared<const Nf4Weight>(
            Nf4Weight::quantize(w->value().narrow(0, e, 1).reshape({x.out, x.in}).contiguous())));
    } else {
      x.weight = *std::move(w);
    }
  }
  return absl::OkStatus();
}

absl::Status WeightLoader::norm(RmsNorm& n, const std::string& name, int64_t dim) {
  n.name = name;
  n.eps = static_cast<float>(config_.rms_norm_eps);
  n.add_one = family_.norm_adds_one;
  auto w = get(name + ".weight", {dim}, n.add_one ? 0.f : 1.f);
  if (!w.ok()) return w.status();
  n.weight = *std::move(w);
  return absl::OkStatus();
}

absl::Status WeightLoader::check_unexpected(std::vector<std::string>* notes) const {
  if (!ck_) return absl::OkStatus();
  std::set<std::string> consumed = consumed_;
  int64_t skipped = 0;
  for (const auto& n : ck_->names()) {
    if (n.size() > 20 && n.ends_with("rotary_emb.inv_freq")) consumed.insert(n);  // buffers some exports carry
    for (const std::string& p : family_.skipped_prefixes)
      if (n.starts_with(p) && consumed.insert(n).second) ++skipped;
  }
  if (skipped > 0 && notes) {
    std::string prefixes;
    for (const std::string& p : family_.skipped_prefixes) absl::StrAppend(&prefixes, prefixes.empty() ? "" : ", ", p);
    notes->push_back(absl::StrCat(ck_->dir(), ": left out ", skipped, " tensors under ", prefixes,
                                  " (Loom reads the language model only)"));
  }
  return ck_->check_unexpected(consumed);
}

}  // namespace loom::detail
