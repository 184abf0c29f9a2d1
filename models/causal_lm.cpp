// CausalLM: building a model from its family's spec (which modules exist, their weights through the
// family's weight map, its block forward) and the forward pass with RoPE tables per layer type; the
// losses are in causal_lm_loss.cpp. No family is named here.
#include "models/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cuda_context.h"
#include "engine/model_path.h"
#include "engine/offload.h"
#include "engine/status_macros.h"
#include "models/bnb_checkpoint.h"
#include "models/checkpoint.h"
#include "models/block.h"
#include "models/family.h"
#include "models/gguf_model.h"
#include "models/layer_streamer.h"
#include "models/weight_loader.h"

namespace loom {

absl::StatusOr<Checkpointing> parse_checkpointing(const std::string& text) {
  if (text == "none") return Checkpointing::kNone;
  if (text == "recompute") return Checkpointing::kRecompute;
  if (text == "offload") return Checkpointing::kOffload;
  return absl::InvalidArgumentError(absl::StrCat("--checkpointing must be none, recompute or offload, got '", text, "'"));
}

const char* checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::kNone: return "none";
    case Checkpointing::kRecompute: return "recompute";
    case Checkpointing::kOffload: return "offload";
  }
  return "?";
}

CausalLM::CausalLM() = default;
CausalLM::~CausalLM() = default;

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::load(const std::string& model_dir, const LoadOptions& options) {
  if (options.dtype != DType::f32 && options.dtype != DType::bf16)
    return absl::InvalidArgumentError(absl::StrCat("model dtype must be f32 or bf16, got ", std::string(name(options.dtype))));
  constexpr const char* kExpected = "a Hugging Face model folder (config.json and safetensors) or a .gguf file";
  LOOM_RETURN_IF_ERROR(check_input_path(model_dir, "model path", kExpected));
  if (is_gguf_path(model_dir)) {  // a llama.cpp file: config and weights rebuilt in Hugging Face form
    auto g = load_gguf_model(model_dir);
    if (!g.ok()) return g.status();
    Checkpoint ck = Checkpoint::from_tensors(model_dir, std::move(g->tensors));
    ck.set_allow_nonfinite(options.allow_nonfinite);
    return build(g->config, model_dir, options, &ck, 0);
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) return wrong_kind(model_dir, sniff_path(model_dir), kExpected);
  auto config = ModelConfig::load(model_dir);
  if (!config.ok()) return config.status();
  auto ck = Checkpoint::open(model_dir);
  if (!ck.ok()) return ck.status();
  ck->set_allow_nonfinite(options.allow_nonfinite);
  return build(*config, model_dir, options, &*ck, 0);
}

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::init_random(const std::string& config_dir, const LoadOptions& options,
                                                                uint64_t seed) {
  auto config = ModelConfig::load(config_dir);
  if (!config.ok()) return config.status();
  return build(*config, config_dir, options, nullptr, seed);
}

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::load(const ModelConfig& config, const std::string& model_dir,
                                                         const LoadOptions& options) {
  if (options.dtype != DType::f32 && options.dtype != DType::bf16)
    return absl::InvalidArgumentError(absl::StrCat("model dtype must be f32 or bf16, got ", std::string(name(options.dtype))));
  auto ck = Checkpoint::open(model_dir);
  if (!ck.ok()) return ck.status();
  ck->set_allow_nonfinite(options.allow_nonfinite);
  return build(config, model_dir, options, &*ck, 0);
}

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::init_random(const ModelConfig& config, const LoadOptions& options,
                                                                uint64_t seed) {
  return build(config, "", options, nullptr, seed);
}

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::build(const ModelConfig& config, const std::string& source_dir,
                                                          const LoadOptions& options, const Checkpoint* ck, uint64_t seed) {
  std::unique_ptr<CausalLM> m(new CausalLM());
  m->config_ = config;
  m->dtype_ = options.dtype;
  m->source_dir_ = source_dir;
  const ModelConfig& c = m->config_;
  if (!c.family) return absl::InternalError("CausalLM: the config has no family (it was not parsed)");
  std::optional<BnbQuantConfig> bnb;
  if (ck && !is_gguf_path(source_dir)) {
    auto q = read_bnb_quant_config(source_dir);
    if (!q.ok() && !absl::IsNotFound(q.status())) return q.status();
    if (q.ok()) bnb = *q;
  }
  m->placement_ = options.placement.value_or(Placement::uniform(options.device, c.num_hidden_layers));
  const Placement& place = m->placement_;
  if (static_cast<int64_t>(place.layers.size()) != c.num_hidden_layers || place.streamed.size() != place.layers.size())
    return absl::InvalidArgumentError(absl::StrCat("the device map places ", place.layers.size(), " decoder layers; the model has ",
                                                   c.num_hidden_layers));
  if (c.tie_word_embeddings && !(place.head == place.embed))
    return absl::InvalidArgumentError(absl::StrCat("lm_head is tied to the embedding: both must be on one device (the map ",
                                                   "puts them on ", place.embed.str(), " and ", place.head.str(), ")"));
  m->device_ = place.embed;
  {  // the GPUs of the map copy activations to each other directly
    std::vector<int> gpus;
    for (const Device& d : place.gpus()) gpus.push_back(d.index);
    enable_peer_access(gpus);
  }
  detail::WeightLoader w(c, ck, options.dtype, place.embed, seed, options.quantize_4bit, bnb);
  w.set_adapter_room(options.adapter_room);
  const FamilySpec& fam = *c.family;
  LOOM_CHECK(fam.block != nullptr, "family ", fam.name, " has no block forward");

  auto embed = w.get("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  if (!embed.ok()) return embed.status();
  m->embed_tokens_ = *std::move(embed);
  m->layers_.reserve(static_cast<size_t>(c.num_hidden_layers));  // the streamer keeps pointers to them
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    w.set_device(place.layers[i]);  // a streamed layer loads there too, then moves to host memory
    DecoderLayer L;
    Attention& a = L.self_attn;
    // The optional norms exist where the family's weight map lists them.
    auto optional_norm = [&](std::optional<RmsNorm>& n, const char* module, int64_t dim) -> absl::Status {
      if (!fam.has_layer_module(module)) return absl::OkStatus();
      n.emplace();
      return w.norm(*n, p + module, dim);
    };
    LOOM_RETURN_IF_ERROR(w.norm(L.input_layernorm, p + "input_layernorm", c.hidden_size));
    LOOM_RETURN_IF_ERROR(w.norm(L.post_attention_layernorm, p + "post_attention_layernorm", c.hidden_size));
    // Fused projections (Phi-3) exist where the family's weight map names them as Loom modules.
    if (fam.has_layer_module("self_attn.qkv_proj")) {
      LOOM_RETURN_IF_ERROR(w.linear(a.qkv_proj, p + "self_attn.qkv_proj", c.q_dim() + 2 * c.kv_dim(), c.hidden_size,
                                    c.attention_bias, true));
    } else {
      LOOM_RETURN_IF_ERROR(w.linear(a.q_proj, p + "self_attn.q_proj", c.q_dim(), c.hidden_size, c.attention_bias, true));
      LOOM_RETURN_IF_ERROR(w.linear(a.k_proj, p + "self_attn.k_proj", c.kv_dim(), c.hidden_size, c.attention_bias, true));
      LOOM_RETURN_IF_ERROR(w.linear(a.v_proj, p + "self_attn.v_proj", c.kv_dim(), c.hidden_size, c.attention_bias, true));
    }
    LOOM_RETURN_IF_ERROR(w.linear(a.o_proj, p + "self_attn.o_proj", c.hidden_size, c.q_dim(), c.o_proj_bias));
    LOOM_RETURN_IF_ERROR(optional_norm(a.q_norm, "self_attn.q_norm", c.head_dim));
    LOOM_RETURN_IF_ERROR(optional_norm(a.k_norm, "self_attn.k_norm", c.head_dim));
    LOOM_RETURN_IF_ERROR(optional_norm(L.pre_feedforward_layernorm, "pre_feedforward_layernorm", c.hidden_size));
    LOOM_RETURN_IF_ERROR(optional_norm(L.post_feedforward_layernorm, "post_feedforward_layernorm", c.hidden_size));
    if (c.is_moe_layer(i)) {
      LOOM_RETURN_IF_ERROR(w.moe(L.moe.emplace(), p));
    } else if (fam.has_layer_module("mlp.gate_up_proj")) {
      LOOM_RETURN_IF_ERROR(
          w.linear(L.mlp.gate_up_proj, p + "mlp.gate_up_proj", 2 * c.intermediate_size, c.hidden_size, c.mlp_bias, true));
    } else {
      LOOM_RETURN_IF_ERROR(w.linear(L.mlp.gate_proj, p + "mlp.gate_proj", c.intermediate_size, c.hidden_size, c.mlp_bias, true));
      LOOM_RETURN_IF_ERROR(w.linear(L.mlp.up_proj, p + "mlp.up_proj", c.intermediate_size, c.hidden_size, c.mlp_bias, true));
    }
    if (!L.moe)
      LOOM_RETURN_IF_ERROR(w.linear(L.mlp.down_proj, p + "mlp.down_proj", c.hidden_size, c.intermediate_size, c.mlp_bias));
    L.mlp.gelu = c.hidden_act == "gelu_pytorch_tanh";
    L.window = c.is_sliding(i) ? c.sliding_window : 0;
    m->layers_.push_back(std::move(L));
    if (place.streamed[i]) {
      if (!m->streamer_) m->streamer_ = std::make_unique<LayerStreamer>(place.layers[i]);
      if (!(m->streamer_->compute_device() == place.layers[i]))
        return absl::InvalidArgumentError(absl::StrCat("the streamed layers run on one device: layer ", i, " is mapped to ",
                                                       place.layers[i].str(), ", an earlier one to ",
                                                       m->streamer_->compute_device().str()));
      m->streamer_->adopt(i, m->layers_.back());
    }
  }
  w.set_device(place.norm);
  LOOM_RETURN_IF_ERROR(w.norm(m->norm_, "model.norm", c.hidden_size));
  m->lm_head_.name = "lm_head";
  if (c.tie_word_embeddings) {
    m->lm_head_.weight = m->embed_tokens_;
    const std::string copy = w.checkpoint_name("lm_head.weight");  // a redundant copy some exports keep
    if (ck && ck->find(copy)) w.mark_consumed(copy);
  } else {
    w.set_device(place.head);
    LOOM_RETURN_IF_ERROR(w.linear(m->lm_head_, "lm_head", c.vocab_size, c.hidden_size, false));
  }
  LOOM_RETURN_IF_ERROR(w.check_unexpected(&m->load_notes_));
  // One RoPE table per layer type (shared when both types rotate alike), two with LongRoPE.
  auto tables = [&](const RopeParams& r, Device d) {
    RopeTables t;
    t.params = &r;
    t.inv_freq = rope_inv_freq_tensor(c.head_dim, r, d);
    if (r.scaling.kind == RopeScaling::Kind::kLongRope) t.inv_freq_long = rope_inv_freq_tensor(c.head_dim, r, d, true);
    return t;
  };
  auto both = [&](Device d) {
    std::pair<RopeTables, RopeTables> t{tables(c.rope, d), {}};
    t.second = c.rope_sliding == c.rope ? t.first : tables(c.rope_sliding, d);
    t.second.params = &c.rope_sliding;
    return t;
  };
  std::tie(m->rope_full_, m->rope_sliding_) = both(place.embed);
  for (const Device& d : place.layers)
    if (!(d == place.embed) && !m->rope_elsewhere_.count(d.str())) m->rope_elsewhere_.emplace(d.str(), both(d));
  return m;
}

absl::Status check_token_ids(const Tensor& ids, int64_t vocab_size, bool targets, const char* what) {
  if (!ids.defined() || !ids.device().is_cpu() || ids.dtype() != DType::i32) return absl::OkStatus();
  const Tensor c = ids.contiguous();
  const int32_t* p = c.data<int32_t>();
  for (int64_t i = 0; i < c.numel(); ++i) {
    if ((p[i] >= 0 && p[i] < vocab_size) || (targets && p[i] == ops::kIgnoreIndex)) continue;
    return absl::OutOfRangeError(absl::StrCat(what, "[", i, "] = ", p[i], " is outside the model's vocabulary of ",
                                              vocab_size, " tokens"));
  }
  return absl::OkStatus();
}

detail::LayerContext CausalLM::context_for(const Tensor& input_ids, const ForwardOptions& options) const {
  if (absl::Status s = check_token_ids(input_ids, config_.vocab_size, false, "input_ids"); !s.ok())
    LOOM_CHECK(false, s.message());
  detail::LayerContext ctx;
  ctx.config = &config_;
  ctx.batch = input_ids.size(0);
  ctx.seq = input_ids.size(1);
  if (options.positions.defined()) {
    ctx.positions = options.positions.to(device_);
  } else {
    std::vector<int32_t> pos(ctx.batch * ctx.seq);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i % ctx.seq);
    ctx.positions = Tensor::from_ints(pos, {ctx.batch * ctx.seq}).to(device_);
  }
  if (options.segment_ids.defined()) ctx.segment_ids = options.segment_ids.to(device_);
  ctx.max_position = options.max_position;
  if (ctx.max_position < 0) {
    if (!options.positions.defined()) {
      ctx.max_position = ctx.seq - 1;
    } else if (rope_full_.inv_freq_long.defined() || rope_sliding_.inv_freq_long.defined()) {
      // Only LongRoPE needs it: the positions are read (back) here unless the caller said.
      const std::vector<int32_t> p = options.positions.to_ints();
      for (int32_t v : p) ctx.max_position = std::max<int64_t>(ctx.max_position, v);
    }
  }
  return ctx;
}

void CausalLM::move_context(detail::LayerContext& ctx, Device d) const {
  if (ctx.positions.defined()) ctx.positions = ctx.positions.to(d);
  if (ctx.segment_ids.defined()) ctx.segment_ids = ctx.segment_ids.to(d);
}

void CausalLM::RopeTables::pick(int64_t max_position, detail::LayerContext& ctx) const {
  ctx.inv_freq = inv_freq_long.defined() && params->uses_long_factors(max_position) ? inv_freq_long : inv_freq;
  ctx.rope_mscale = params->mscale();
}

ag::Variable CausalLM::forward(const Tensor& input_ids, const ForwardOptions& options) const {
  LOOM_CHECK(input_ids.dim() == 2 && input_ids.dtype() == DType::i32, "CausalLM::forward: input_ids must be i32 ",
             "[batch, seq], got ", input_ids.str());
  detail::LayerContext ctx = context_for(input_ids, options);
  std::vector<RouterOutput> routers;
  if (options.aux_loss && config_.moe.experts > 0) ctx.routers = &routers;
  ag::Variable logits = run(input_ids, ctx, nullptr);
  if (!routers.empty()) *options.aux_loss = load_balancing_loss(routers, options.aux_spans);
  return logits;
}

ag::Variable CausalLM::hidden_states(const Tensor& input_ids, detail::LayerContext& ctx, KvCache* cache,
                                     bool last_only) const {
  const ModelConfig& c = config_;
  ag::Variable x = ag::embedding(input_ids.to(device_), embed_tokens_);  // device_: the embedding's
  if (c.family->embed_scale) {
    // transformers multiplies by sqrt(hidden_size) rounded to the model dtype.
    const float normalizer = std::sqrt(static_cast<float>(c.hidden_size));
    x = ag::scale(x, dtype_ == DType::bf16 ? bf16_to_float(float_to_bf16(normalizer)) : normalizer);
  }
  const BlockForward block = c.family->block;
  const bool training = !cache && ag::grad_enabled();
  ag::CheckpointOptions checkpoint_options;
  checkpoint_options.offload = checkpointing_ == Checkpointing::kOffload;
  if (training && checkpoint_options.offload) {
    // The attention outputs may fill what the layer inputs (which must leave the GPU) leave of the
    // pinned budget, less an eighth of theirs: backward's reruns then skip the attention forwards.
    const int64_t inputs = static_cast<int64_t>(layers_.size()) * static_cast<int64_t>(x.value().nbytes());
    checkpoint_options.stash_room = std::make_shared<std::atomic<int64_t>>(offload_host_room() - inputs - inputs / 8);
  }
  checkpoint_options.captures_trainable = true;  // the layer's LoRA (or full) weights
  Device at = device_;  // where x and ctx's tensors are
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Device d = placement_.layers[i];
    if (!(d == at)) {  // a hop to the next device of the map: the activations and the context follow
      x = ag::to_device(x, d);
      move_context(ctx, d);
      at = d;
    }
    if (cache) {
      ctx.k_cache = &cache->k[i];
      ctx.v_cache = &cache->v[i];
    }
    const RopeTables *full = &rope_full_, *sliding = &rope_sliding_;
    if (!(d == device_)) {
      const auto& there = rope_elsewhere_.at(d.str());
      full = &there.first, sliding = &there.second;
    }
    (c.is_sliding(static_cast<int64_t>(i)) ? sliding : full)->pick(ctx.max_position, ctx);
    // A streamed layer's weights are on the device only while it runs: backward cannot keep
    // activations that point at them, so it always recomputes.
    LayerStreamer* streamer = streamer_ && streamer_->streamed(static_cast<int64_t>(i)) ? streamer_.get() : nullptr;
    if (training && (checkpointing_ != Checkpointing::kNone || streamer)) {
      // The layer runs again in backward: it captures its context by value. Its first run (forward,
      // grad off) walks the layers up, its rerun (backward, grad on) down: the streamer prefetches so.
      // A MoE layer's router logits leave as a second output (on the tape for the load-balancing
      // loss); the experts chosen, constants, from the first run.
      const bool report = ctx.routers && layers_[i].moe;
      auto ids = std::make_shared<Tensor>();
      const auto index = static_cast<int64_t>(i);
      auto layer = [L = &layers_[i], block, lctx = ctx, report, ids, streamer, index](const std::vector<ag::Variable>& in) {
        if (streamer) streamer->acquire(index, ag::grad_enabled() ? -1 : +1);
        std::vector<RouterOutput> routers;
        detail::LayerContext c = lctx;
        c.routers = report ? &routers : nullptr;
        // Run again in backward, the layer's output is only where its gradients start: the forward's
        // value (the first run's) is what the layers above read.
        c.output_unread = ag::recomputing() && ag::grad_enabled();  // the first run is without grad
        std::vector<ag::Variable> out{block(*L, in[0], c)};
        if (report) {
          out.push_back(routers.at(0).logits);
          if (!ids->defined()) *ids = routers[0].ids;
        }
        return out;
      };
      std::vector<ag::Variable> out = ag::checkpoint(layer, {x}, checkpoint_options);
      x = out[0];
      if (report) ctx.routers->push_back(RouterOutput{out.at(1), *ids});
    } else {
      if (streamer) streamer->acquire(static_cast<int64_t>(i), +1);
      x = block(layers_[i], x, ctx);
    }
  }
  // A prompt's prefill needs only the last position's logits: [1, n, vocab] in f32 can be gigabytes.
  if (last_only && x.size(1) > 1) x = ag::narrow(x, 1, x.size(1) - 1, 1);
  return norm_.forward(ag::to_device(x, placement_.norm));
}

ag::Variable CausalLM::head(const ag::Variable& h) const {
  ag::Variable logits = lm_head_.forward(ag::to_device(h, placement_.head));
  if (config_.final_logit_softcapping > 0.f) logits = ag::softcap(logits, config_.final_logit_softcapping);
  return ag::cast(logits, precision().logits);
}

ag::Variable CausalLM::run(const Tensor& input_ids, detail::LayerContext& ctx, KvCache* cache, bool last_only) const {
  return head(hidden_states(input_ids, ctx, cache, last_only));
}

CausalLM::KvCache CausalLM::make_cache(int64_t capacity) const {
  KvCache cache;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Device d = placement_.layers[i];
    cache.k.push_back(Tensor::zeros({1, capacity, config_.num_key_value_heads, config_.head_dim}, dtype_, d));
    cache.v.push_back(Tensor::zeros({1, capacity, config_.num_key_value_heads, config_.head_dim}, dtype_, d));
  }
  return cache;
}

ag::Variable CausalLM::forward_cached(const Tensor& input_ids, KvCache& cache, bool all_positions) const {
  LOOM_CHECK(input_ids.dim() == 2 && input_ids.size(0) == 1 && input_ids.dtype() == DType::i32,
             "forward_cached: input_ids must be i32 [1, n], got ", input_ids.str());
  LOOM_CHECK(!cache.k.empty() && cache.length + input_ids.size(1) <= cache.k[0].size(1), "forward_cached: ",
             cache.length, " + ", input_ids.size(1), " tokens exceed the cache capacity");
  ag::NoGradGuard no_grad;
  detail::LayerContext ctx;
  ctx.config = &config_;
  ctx.batch = 1;
  ctx.seq = input_ids.size(1);
  ctx.cache_start = cache.length;
  std::vector<int32_t> pos(ctx.seq);
  for (int64_t i = 0; i < ctx.seq; ++i) pos[i] = static_cast<int32_t>(cache.length + i);
  ctx.positions = Tensor::from_ints(pos, {ctx.seq}).to(device_);
  // As transformers' generate: LongRoPE's factors follow the length so far (the cache keeps what
  // earlier steps rotated).
  ctx.max_position = cache.length + ctx.seq - 1;
  ag::Variable logits = run(input_ids, ctx, &cache, !all_positions);
  cache.length += ctx.seq;
  return logits;
}

std::vector<Linear*> CausalLM::linears() {
  std::vector<Linear*> out;
  for (DecoderLayer& L : layers_) {
    for (Linear* l : L.self_attn.linears()) out.push_back(l);
    for (Linear* l : L.mlp.linears()) out.push_back(l);
  }
  if (!config_.tie_word_embeddings) out.push_back(&lm_head_);
  return out;
}

std::vector<Linear*> CausalLM::norm_readers() {
  std::vector<Linear*> out;
  for (DecoderLayer& L : layers_) {
    for (Linear* l : L.self_attn.input_readers()) out.push_back(l);
    if (!L.moe)
      for (Linear* l : L.mlp.input_readers()) out.push_back(l);
  }
  return out;
}

std::vector<ExpertLinear*> CausalLM::expert_linears() {
  std::vector<ExpertLinear*> out;
  for (DecoderLayer& L : layers_)
    if (L.moe)
      for (ExpertLinear* e : L.moe->experts()) out.push_back(e);
  return out;
}

std::vector<const ExpertLinear*> CausalLM::expert_linears() const {
  std::vector<const ExpertLinear*> out;
  for (ExpertLinear* e : const_cast<CausalLM*>(this)->expert_linears()) out.push_back(e);
  return out;
}

std::vector<const Linear*> CausalLM::linears() const {
  std::vector<const Linear*> out;
  for (Linear* l : const_cast<CausalLM*>(this)->linears()) out.push_back(l);
  return out;
}

std::vector<std::pair<std::string, const ag::Variable*>> CausalLM::named_weights() const {
  std::vector<std::pair<std::string, const ag::Variable*>> out;
  out.emplace_back("model.embed_tokens.weight", &embed_tokens_);
  auto add_norm = [&](const RmsNorm& n) { out.emplace_back(n.name + ".weight", &n.weight); };
  auto add_linear = [&](const Linear& l) {
    if (!l.quantized()) out.emplace_back(l.name + ".weight", &l.weight);  // 4-bit weights are not Variables
    if (l.bias.defined()) out.emplace_back(l.name + ".bias", &l.bias);
  };
  for (const DecoderLayer& L : layers_) {
    add_norm(L.input_layernorm);
    const Attention& a = L.self_attn;
    for (const Linear* l : const_cast<Attention&>(a).linears()) add_linear(*l);
    if (a.q_norm) add_norm(*a.q_norm);
    if (a.k_norm) add_norm(*a.k_norm);
    add_norm(L.post_attention_layernorm);
    if (L.pre_feedforward_layernorm) add_norm(*L.pre_feedforward_layernorm);
    if (L.post_feedforward_layernorm) add_norm(*L.post_feedforward_layernorm);
    for (const Linear* l : const_cast<Mlp&>(L.mlp).linears()) add_linear(*l);
    if (L.moe) {
      out.emplace_back(L.moe->name + ".gate.weight", &L.moe->router);
      for (const ExpertLinear* e : const_cast<MoeMlp&>(*L.moe).experts())
        if (!e->quantized()) out.emplace_back(e->name, &e->weight);
    }
  }
  add_norm(norm_);
  if (!config_.tie_word_embeddings) add_linear(lm_head_);
  return out;
}

std::vector<std::pair<std::string, ag::Variable*>> CausalLM::named_weights() {
  std::vector<std::pair<std::string, ag::Variable*>> out;
  for (auto& [name, v] : std::as_const(*this).named_weights()) out.emplace_back(name, const_cast<ag::Variable*>(v));
  return out;
}

void CausalLM::set_weights_trainable(bool trainable) {
  for (auto& [name, v] : named_weights()) *v = ag::Variable(v->value(), trainable);
  if (config_.tie_word_embeddings) lm_head_.weight = embed_tokens_;  // re-tie to the new leaf
}

}  // namespace loom
