// GGUF -> Hugging Face: llama.cpp's metadata keys (llama-arch.cpp, gguf-py constants) mapped back to
// config.json fields (the shared ones here, the family's through its spec), tensor names through the
// family's weight map, and convert_hf_to_gguf.py's weight changes undone (models/family.h GgufFix).
#include "models/gguf_model.h"

#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/status_macros.h"
#include "models/family.h"
#include "models/gguf_export.h"
#include "models/weight_map.h"

namespace loom {
namespace {

using nlohmann::json;

// Metadata under `<arch>.` that must be one integer (llama.cpp allows per-layer arrays for some).
absl::StatusOr<int64_t> uniform_int(const GgufFile& f, const std::string& key) {
  const GgufKv* kv = f.find(key);
  if (kv && kv->value.type == GgufType::kArray) {
    auto v = f.get_ints(key);
    if (!v.ok()) return v.status();
    for (int64_t x : *v)
      if (x != v->front())
        return absl::UnimplementedError(absl::StrCat(f.path(), ": metadata '", key, "' differs between layers; ",
                                                     "Loom supports one value for all layers"));
    if (v->empty()) return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata '", key, "' is an empty array"));
    return v->front();
  }
  return f.get_int(key);
}

void set_opt_int(const GgufFile& f, const std::string& key, json& j, const char* field) {
  if (auto v = f.get_int(key); v.ok()) j[field] = *v;
}

}  // namespace

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return path.size() > 5 && path.ends_with(".gguf") && !std::filesystem::is_directory(path, ec);
}

absl::StatusOr<json> gguf_hf_config(const GgufFile& f) {
  LOOM_ASSIGN_OR_RETURN(const std::string arch, f.get_string("general.architecture"));
  const std::string p = arch + ".";
  // Stacked experts (llama.cpp's `llama` is Mixtral too): the family with experts reads the file.
  const int64_t experts = f.get_int(p + "expert_count").value_or(0);
  const FamilySpec* family = family_from_gguf_architecture(arch, experts > 0);
  if (!family) {
    if (const FamilySpec* other = family_from_gguf_architecture(arch, experts <= 0))
      return absl::UnimplementedError(
          experts > 0 ? absl::StrCat(f.path(), ": ", p, "expert_count is ", experts, ", but Loom reads ", arch,
                                     " files as ", other->name, ", which has no mixture of experts")
                      : absl::StrCat(f.path(), ": no ", p, "expert_count above 0; Loom reads ", arch, " files as ",
                                     other->name, ", a mixture of experts"));
    return absl::UnimplementedError(
        absl::StrCat(f.path(), ": general.architecture is '", arch, "'; Loom maps ",
                     family_names([](const FamilySpec& s) { return !s.gguf_read_arch.empty(); }), " GGUF models"));
  }
  json j;
  j["model_type"] = family->name;
  j["architectures"] = json::array({family->architectures.front()});
  LOOM_ASSIGN_OR_RETURN(const int64_t hidden, f.get_int(p + "embedding_length"));
  LOOM_ASSIGN_OR_RETURN(const int64_t layers, f.get_int(p + "block_count"));
  LOOM_ASSIGN_OR_RETURN(const int64_t ff, uniform_int(f, p + "feed_forward_length"));
  LOOM_ASSIGN_OR_RETURN(const int64_t heads, uniform_int(f, p + "attention.head_count"));
  int64_t kv_heads = heads;
  if (f.has(p + "attention.head_count_kv")) {
    LOOM_ASSIGN_OR_RETURN(kv_heads, uniform_int(f, p + "attention.head_count_kv"));
  }
  if (heads <= 0 || hidden <= 0)
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", p, "attention.head_count and ", p,
                                                   "embedding_length must be > 0"));
  int64_t head_dim = hidden / heads;
  if (f.has(p + "attention.key_length")) {
    LOOM_ASSIGN_OR_RETURN(head_dim, f.get_int(p + "attention.key_length"));
  }
  if (f.has(p + "attention.value_length")) {
    LOOM_ASSIGN_OR_RETURN(const int64_t v_len, f.get_int(p + "attention.value_length"));
    if (v_len != head_dim)
      return absl::UnimplementedError(absl::StrCat(f.path(), ": attention.key_length ", head_dim, " != value_length ", v_len));
  }
  if (f.has(p + "rope.dimension_count")) {
    LOOM_ASSIGN_OR_RETURN(const int64_t rope_dim, f.get_int(p + "rope.dimension_count"));
    if (rope_dim != head_dim && (!family->partial_rotary || rope_dim <= 0 || rope_dim > head_dim || rope_dim % 2))
      return absl::UnimplementedError(absl::StrCat(f.path(), ": ", p, "rope.dimension_count is ", rope_dim,
                                                   " but heads are ", head_dim, " wide: partial rotary embeddings are not ",
                                                   "part of ", family->name, " models"));
    if (rope_dim != head_dim) j["partial_rotary_factor"] = static_cast<double>(rope_dim) / static_cast<double>(head_dim);
  }
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd || embd->ne.size() != 2)
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": no 2-D tensor 'token_embd.weight'"));
  j["vocab_size"] = embd->ne[1];
  j["hidden_size"] = hidden;
  j["intermediate_size"] = ff;
  j["num_hidden_layers"] = layers;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = kv_heads;
  j["head_dim"] = head_dim;
  if (auto ctx = f.get_int(p + "context_length"); ctx.ok()) j["max_position_embeddings"] = *ctx;
  if (auto eps = f.get_float(p + "attention.layer_norm_rms_epsilon"); eps.ok()) {
    // GGUF stores it as f32: print the shortest decimal that rounds to that f32 (1e-05, not 9.99e-06).
    const float e = static_cast<float>(*eps);
    double shortest = *eps;
    for (int digits = 1; digits <= 9; ++digits) {
      double d;
      if (absl::SimpleAtod(absl::StrFormat("%.*g", digits, e), &d) && static_cast<float>(d) == e) {
        shortest = d;
        break;
      }
    }
    j["rms_norm_eps"] = shortest;
  }
  j["rope_theta"] = f.get_float(p + "rope.freq_base").value_or(10000.0);
  const std::string scaling = f.get_string(p + "rope.scaling.type").value_or("none");
  double factor = f.get_float(p + "rope.scaling.factor").value_or(0);
  if (scaling == "linear" || (!f.has(p + "rope.scaling.type") && f.has(p + "rope.scale_linear"))) {
    if (!f.has(p + "rope.scaling.factor")) factor = f.get_float(p + "rope.scale_linear").value_or(1);
    if (factor != 1) j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
  } else if (scaling != "none") {
    return absl::UnimplementedError(absl::StrCat(f.path(), ": ", p, "rope.scaling.type is '", scaling,
                                                 "'; Loom maps none and linear"));
  }
  // LongRoPE (Phi-3): convert_hf_to_gguf.py keeps the factor lists as two f32 tensors.
  const GgufTensorInfo* long_f = f.find_tensor(kRopeFactorsLong);
  const GgufTensorInfo* short_f = f.find_tensor(kRopeFactorsShort);
  if (long_f || short_f) {
    if (!long_f || !short_f)
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": LongRoPE needs both '", kRopeFactorsLong, "' and '",
                                                     kRopeFactorsShort, "', the file has one"));
    json rs = {{"type", "longrope"}};
    for (const auto& [key, info] : {std::pair{"long_factor", long_f}, std::pair{"short_factor", short_f}}) {
      LOOM_ASSIGN_OR_RETURN(Tensor t, f.read_f32(*info));
      rs[key] = json::array();
      for (float v : t.to_floats()) rs[key].push_back(static_cast<double>(v));
    }
    j["rope_scaling"] = rs;
  }
  if (f.find_tensor("rope_freqs.weight"))
    return absl::UnimplementedError(absl::StrCat(
        f.path(), ": tensor 'rope_freqs.weight' holds per-frequency RoPE factors (Llama 3.1-style scaling); "
                  "Loom cannot yet map those back to rope_scaling"));
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  if (family->gguf_to_config) LOOM_RETURN_IF_ERROR(family->gguf_to_config(f, p, j));
  set_opt_int(f, "tokenizer.ggml.bos_token_id", j, "bos_token_id");
  set_opt_int(f, "tokenizer.ggml.eos_token_id", j, "eos_token_id");
  set_opt_int(f, "tokenizer.ggml.padding_token_id", j, "pad_token_id");
  j["torch_dtype"] = "float32";
  return j;
}

json gguf_generation_config(const GgufFile& f) {
  json g = {{"_from_model_config", true}};
  set_opt_int(f, "tokenizer.ggml.bos_token_id", g, "bos_token_id");
  set_opt_int(f, "tokenizer.ggml.eos_token_id", g, "eos_token_id");
  set_opt_int(f, "tokenizer.ggml.padding_token_id", g, "pad_token_id");
  return g;
}

std::string gguf_to_hf_name(const std::string& gguf_name, const FamilySpec& family) {
  auto m = gguf_to_hf(family, gguf_name);
  return m ? m->name : "";
}

namespace {
// Per head, Hugging Face's rows (2, head_dim/2) and the file's (head_dim/2, 2): to_file moves rows
// from the first layout to the second (convert_hf_to_gguf.py's permute), else back.
Tensor move_rope_rows(const Tensor& t, int64_t n_head, bool to_file, const char* op) {
  LOOM_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.dim() >= 1 && t.size(0) % (2 * n_head) == 0, op,
             ": ", t.str(), " is not f32 [n_head * head_dim, ...] for ", n_head, " heads");
  const int64_t rows = t.size(0), cols = t.numel() / rows, half = rows / n_head / 2;
  Tensor out = Tensor::empty(t.shape(), DType::f32);
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t k = 0; k < 2; ++k) {
        const int64_t file_row = h * 2 * half + i * 2 + k, hf_row = h * 2 * half + k * half + i;
        const int64_t from = to_file ? hf_row : file_row, to = to_file ? file_row : hf_row;
        std::copy(src + from * cols, src + (from + 1) * cols, dst + to * cols);
      }
  return out;
}
}  // namespace

Tensor unpermute_rope_rows(const Tensor& t, int64_t n_head) { return move_rope_rows(t, n_head, false, "unpermute_rope_rows"); }
Tensor permute_rope_rows(const Tensor& t, int64_t n_head) { return move_rope_rows(t, n_head, true, "permute_rope_rows"); }

Tensor apply_gguf_fix(Tensor t, GgufFix fix, const ModelConfig& c, bool to_file) {
  switch (fix) {
    case GgufFix::kNone:
      return t;
    case GgufFix::kRopePermuteQ:  // rows (weights and biases) of q by num_attention_heads, of k by num_key_value_heads
      return move_rope_rows(t, c.num_attention_heads, to_file, to_file ? "permute_rope_rows" : "unpermute_rope_rows");
    case GgufFix::kRopePermuteK:
      return move_rope_rows(t, c.num_key_value_heads, to_file, to_file ? "permute_rope_rows" : "unpermute_rope_rows");
    case GgufFix::kNormPlusOne: {  // the file holds (1 + w) as applied; transformers keeps w
      float* p = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] += to_file ? 1.f : -1.f;
      return t;
    }
  }
  return t;
}

Tensor undo_gguf_fix(Tensor t, GgufFix fix, const ModelConfig& c) { return apply_gguf_fix(std::move(t), fix, c, false); }
Tensor do_gguf_fix(Tensor t, GgufFix fix, const ModelConfig& c) { return apply_gguf_fix(std::move(t), fix, c, true); }

absl::StatusOr<std::map<std::string, Tensor>> gguf_hf_tensors(const GgufFile& f, const ModelConfig& c) {
  std::map<std::string, Tensor> out;
  for (const GgufTensorInfo& info : f.tensors()) {
    if (info.name == kRopeFactorsLong || info.name == kRopeFactorsShort) continue;  // in config.json's rope_scaling
    if (auto pattern = hf_expert_name_from_gguf(*c.family, info.name)) {  // stacked: the hub's tensor per expert
      LOOM_ASSIGN_OR_RETURN(Tensor t, f.read_f32(info));
      if (t.dim() != 3)
        return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", info.name, "' is ", t.str(),
                                                       "; llama.cpp's stacked experts are 3-D [experts, out, in]"));
      const size_t at = pattern->find("{e}");
      for (int64_t e = 0; e < t.size(0); ++e)
        out.emplace(std::string(*pattern).replace(at, 3, std::to_string(e)),
                    t.narrow(0, e, 1).reshape({t.size(1), t.size(2)}));
      continue;
    }
    const auto hf = gguf_to_hf(*c.family, info.name);
    if (!hf)
      return absl::UnimplementedError(absl::StrCat(f.path(), ": tensor '", info.name, "' has no Hugging Face ",
                                                   c.model_type, " counterpart that Loom knows"));
    LOOM_ASSIGN_OR_RETURN(Tensor t, f.read_f32(info));
    t = undo_gguf_fix(std::move(t), hf->fix, c);
    out.emplace(hf->name, std::move(t));
  }
  return out;
}

absl::StatusOr<GgufModel> load_gguf_model(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(path));
  GgufModel m;
  LOOM_ASSIGN_OR_RETURN(m.config_json, gguf_hf_config(f));
  LOOM_ASSIGN_OR_RETURN(m.config, ModelConfig::from_json_text(m.config_json.dump(), path + " (GGUF metadata)"));
  LOOM_ASSIGN_OR_RETURN(m.tensors, gguf_hf_tensors(f, m.config));
  return m;
}

}  // namespace loom
