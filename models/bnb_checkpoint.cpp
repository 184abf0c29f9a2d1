// bitsandbytes 4-bit checkpoints (models/bnb_checkpoint.h): the layout of bitsandbytes 0.50's
// QuantState.as_dict(packed=True) / from_dict and transformers' BitsAndBytesConfig.to_dict().
#include "models/bnb_checkpoint.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/nf4.h"

namespace loom {
namespace {

absl::Status bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// torch dtype names as bitsandbytes writes them (str(dtype) without "torch.").
const char* torch_dtype_name(DType d) {
  switch (d) {
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::f32: return "float32";
    default: return nullptr;
  }
}
std::optional<DType> dtype_from_torch_name(const std::string& s) {
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16") return DType::f16;
  if (s == "float32") return DType::f32;
  return std::nullopt;
}

}  // namespace

bool BnbQuantConfig::skips(const std::string& module_name) const {
  for (const std::string& key : skip_modules)
    if (!key.empty() && (absl::StartsWith(module_name, key) || absl::EndsWith(module_name, key))) return true;
  return false;
}

absl::StatusOr<std::optional<BnbQuantConfig>> parse_bnb_quant_config(const nlohmann::json& config,
                                                                    const std::string& where) {
  if (!config.is_object() || !config.contains("quantization_config") || config["quantization_config"].is_null())
    return std::optional<BnbQuantConfig>{};
  const nlohmann::json& q = config["quantization_config"];
  const std::string at = where + ": quantization_config";
  if (!q.is_object()) return bad(at, "expected an object");
  auto get_bool = [&](const char* key, bool dflt) -> absl::StatusOr<bool> {
    if (!q.contains(key) || q[key].is_null()) return dflt;
    if (!q[key].is_boolean()) return bad(absl::StrCat(at, ".", key), absl::StrCat("expected true or false, got ", q[key].dump()));
    return q[key].get<bool>();
  };
  auto get_str = [&](const char* key, const std::string& dflt) -> absl::StatusOr<std::string> {
    if (!q.contains(key) || q[key].is_null()) return dflt;
    if (!q[key].is_string()) return bad(absl::StrCat(at, ".", key), absl::StrCat("expected a string, got ", q[key].dump()));
    return q[key].get<std::string>();
  };
  auto method = get_str("quant_method", "bitsandbytes");
  if (!method.ok()) return method.status();
  if (*method != "bitsandbytes")
    return bad(at + ".quant_method", absl::StrCat("'", *method, "' is not supported (Loom loads bitsandbytes 4-bit checkpoints)"));
  auto in4 = get_bool("load_in_4bit", false);
  auto in4_private = get_bool("_load_in_4bit", false);
  auto in8 = get_bool("load_in_8bit", false);
  auto in8_private = get_bool("_load_in_8bit", false);
  for (const auto* s : {&in4, &in4_private, &in8, &in8_private})
    if (!s->ok()) return s->status();
  if (*in8 || *in8_private)
    return bad(at + ".load_in_8bit", "8-bit (LLM.int8) bitsandbytes checkpoints are not supported; only 4-bit NF4");
  if (!*in4 && !*in4_private) return bad(at + ".load_in_4bit", "is not true: not a 4-bit bitsandbytes checkpoint");
  BnbQuantConfig c;
  auto type = get_str("bnb_4bit_quant_type", "fp4");  // transformers' default when absent
  if (!type.ok()) return type.status();
  if (*type != "nf4")
    return bad(at + ".bnb_4bit_quant_type", absl::StrCat("'", *type, "' is not supported: Loom computes with NF4 only"));
  c.quant_type = *type;
  auto dq = get_bool("bnb_4bit_use_double_quant", false);
  if (!dq.ok()) return dq.status();
  c.double_quant = *dq;
  auto cd = get_str("bnb_4bit_compute_dtype", "float32");
  if (!cd.ok()) return cd.status();
  if (!dtype_from_torch_name(*cd))
    return bad(at + ".bnb_4bit_compute_dtype", absl::StrCat("'", *cd, "': expected bfloat16, float16 or float32"));
  c.compute_dtype = *cd;
  auto storage = get_str("bnb_4bit_quant_storage", "uint8");
  if (!storage.ok()) return storage.status();
  if (*storage != "uint8")
    return bad(at + ".bnb_4bit_quant_storage", absl::StrCat("'", *storage, "' is not supported: only uint8"));
  c.quant_storage = *storage;
  if (q.contains("llm_int8_skip_modules") && !q["llm_int8_skip_modules"].is_null()) {
    const auto& s = q["llm_int8_skip_modules"];
    if (!s.is_array()) return bad(at + ".llm_int8_skip_modules", "expected a list of module names or null");
    for (const auto& e : s) {
      if (!e.is_string()) return bad(at + ".llm_int8_skip_modules", absl::StrCat("expected strings, got ", e.dump()));
      c.skip_modules.push_back(e.get<std::string>());
    }
  }
  return std::optional<BnbQuantConfig>(std::move(c));
}

absl::StatusOr<std::optional<BnbQuantConfig>> read_bnb_quant_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return bad(path, "is a folder, not a file");
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return bad(path, "not valid JSON");
  return parse_bnb_quant_config(j, path);
}

nlohmann::json bnb_quant_config_json(const BnbQuantConfig& c) {
  nlohmann::json q;
  q["_load_in_4bit"] = true;
  q["_load_in_8bit"] = false;
  q["bnb_4bit_compute_dtype"] = c.compute_dtype;
  q["bnb_4bit_quant_storage"] = c.quant_storage;
  q["bnb_4bit_quant_type"] = c.quant_type;
  q["bnb_4bit_use_double_quant"] = c.double_quant;
  q["llm_int8_enable_fp32_cpu_offload"] = false;
  q["llm_int8_has_fp16_weight"] = false;
  q["llm_int8_skip_modules"] = c.skip_modules.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.skip_modules);
  q["llm_int8_threshold"] = 6.0;
  q["load_in_4bit"] = true;
  q["load_in_8bit"] = false;
  q["quant_method"] = "bitsandbytes";
  return q;
}

bool bnb_quantizes(const std::string& name, const BnbQuantConfig* config) {
  if (!absl::EndsWith(name, ".weight")) return false;
  const std::string module = name.substr(0, name.size() - 7);
  const size_t dot = module.rfind('.');
  const std::string leaf = dot == std::string::npos ? module : module.substr(dot + 1);
  static const char* const kLinears[] = {"q_proj",  "k_proj",   "v_proj",   "o_proj",      "gate_proj",
                                         "up_proj", "down_proj", "qkv_proj", "gate_up_proj"};
  bool linear = false;
  for (const char* l : kLinears) linear = linear || leaf == l;
  return linear && !(config && config->skips(module));
}

bool is_nf4(const Checkpoint& ckpt, const std::string& weight_name) {
  const TensorInfo* w = ckpt.find(weight_name);
  if (!w || w->dtype != DType::u8) return false;
  for (const char* suffix : {".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4", ".absmax"})
    if (ckpt.find(weight_name + suffix)) return true;
  return false;
}

std::vector<std::string> nf4_companion_names(const std::string& weight_name) {
  std::vector<std::string> out;
  for (const char* suffix : {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                             ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"})
    out.push_back(weight_name + suffix);
  return out;
}

absl::StatusOr<Nf4Weight> load_nf4(const Checkpoint& ckpt, const std::string& weight_name, const Shape& expected,
                                   Device device) {
  const std::string qs_name = weight_name + ".quant_state.bitsandbytes__nf4";
  auto where = [&](const std::string& tensor) {
    const std::string file = ckpt.file_of(tensor);
    return absl::StrCat(file.empty() ? ckpt.dir() : file, ": tensor '", tensor, "'");
  };
  if (!ckpt.find(qs_name)) {
    if (ckpt.find(weight_name + ".quant_state.bitsandbytes__fp4"))
      return bad(where(weight_name + ".quant_state.bitsandbytes__fp4"), "quant_type fp4 is not supported: Loom computes with NF4 only");
    return bad(where(weight_name), absl::StrCat("is 4-bit but its quant state tensor '", qs_name, "' is missing"));
  }
  // The quant state: a U8 tensor of JSON text.
  const TensorInfo* qs_info = ckpt.find(qs_name);
  if (qs_info->dtype != DType::u8 || qs_info->shape.size() != 1)
    return bad(where(qs_name), absl::StrCat("expected U8 bytes of JSON, got ", std::string(name(qs_info->dtype)), " ", shape_str(qs_info->shape)));
  auto qs_t = ckpt.load(qs_name, DType::u8, Device::cpu());
  if (!qs_t.ok()) return qs_t.status();
  const std::string text(reinterpret_cast<const char*>(qs_t->data<uint8_t>()), static_cast<size_t>(qs_t->numel()));
  const nlohmann::json qs = nlohmann::json::parse(text, nullptr, false);
  if (qs.is_discarded() || !qs.is_object()) return bad(where(qs_name), "does not hold a JSON object");
  auto field = [&](const char* key) { return absl::StrCat(where(qs_name), " field '", key, "'"); };
  for (const char* key : {"quant_type", "blocksize", "dtype", "shape"})
    if (!qs.contains(key)) return absl::InvalidArgumentError(absl::StrCat(field(key), " is missing"));
  if (!qs["quant_type"].is_string() || qs["quant_type"] != "nf4")
    return absl::InvalidArgumentError(absl::StrCat(field("quant_type"), ": ", qs["quant_type"].dump(), " is not supported (only \"nf4\")"));
  if (!qs["blocksize"].is_number_integer() || qs["blocksize"].get<int64_t>() != kNf4Block)
    return absl::InvalidArgumentError(absl::StrCat(field("blocksize"), ": ", qs["blocksize"].dump(), " is not supported (only ", kNf4Block, ")"));
  if (!qs["dtype"].is_string() || !dtype_from_torch_name(qs["dtype"].get<std::string>()))
    return absl::InvalidArgumentError(absl::StrCat(field("dtype"), ": ", qs["dtype"].dump(), ", expected bfloat16, float16 or float32"));
  Shape shape;
  if (!qs["shape"].is_array()) return absl::InvalidArgumentError(absl::StrCat(field("shape"), ": expected a list"));
  for (const auto& d : qs["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0)
      return absl::InvalidArgumentError(absl::StrCat(field("shape"), ": ", qs["shape"].dump(), " is not a shape"));
    shape.push_back(d.get<int64_t>());
  }
  if (!expected.empty() && shape != expected)
    return absl::InvalidArgumentError(absl::StrCat(field("shape"), ": ", shape_str(shape), ", the model expects ", shape_str(expected)));
  if (shape.size() != 2) return absl::InvalidArgumentError(absl::StrCat(field("shape"), ": ", shape_str(shape), " is not [out, in]"));

  Nf4Weight w;
  w.shape = shape;
  w.dtype = *dtype_from_torch_name(qs["dtype"].get<std::string>());
  const int64_t n = numel_of(shape), blocks = nf4_blocks(n);
  const bool nested = qs.contains("nested_offset") || ckpt.find(weight_name + ".nested_absmax");

  // Each companion: present, of its dtype and element count (bitsandbytes writes 1-D tensors, the
  // packed weight as [n / 2, 1]), loaded straight onto the device.
  auto load = [&](const std::string& tensor, DType dtype, int64_t count) -> absl::StatusOr<Tensor> {
    const TensorInfo* info = ckpt.find(tensor);
    if (!info) return bad(where(weight_name), absl::StrCat("is 4-bit but its quant state tensor '", tensor, "' is missing"));
    if (info->dtype != dtype)
      return bad(where(tensor), absl::StrCat("has dtype ", std::string(name(info->dtype)), ", expected ", std::string(name(dtype))));
    if (numel_of(info->shape) != count)
      return bad(where(tensor), absl::StrCat("has shape ", shape_str(info->shape), " (", numel_of(info->shape),
                                             " elements), expected ", count, " for a weight of shape ", shape_str(shape)));
    auto t = ckpt.load(tensor, dtype, device);
    if (!t.ok()) return t.status();
    return t->reshape({count});
  };
  auto packed = load(weight_name, DType::u8, nf4_packed_bytes(n));
  if (!packed.ok()) return packed.status();
  w.packed = *std::move(packed);
  auto absmax = load(weight_name + ".absmax", nested ? DType::u8 : DType::f32, blocks);
  if (!absmax.ok()) return absmax.status();
  w.absmax = *std::move(absmax);
  auto qmap = load(weight_name + ".quant_map", DType::f32, 16);
  if (!qmap.ok()) return qmap.status();
  const std::vector<float> qm = qmap->to_floats();
  for (int i = 0; i < 16; ++i) {
    if (std::memcmp(&qm[i], &kNf4Code[i], sizeof(float)) != 0)
      return bad(where(weight_name + ".quant_map"), absl::StrCat("entry ", i, " is ", qm[i], ", NF4's code book has ", kNf4Code[i]));
    w.code[i] = qm[i];
  }
  if (nested) {
    for (const char* key : {"nested_blocksize", "nested_offset"})
      if (!qs.contains(key)) return absl::InvalidArgumentError(absl::StrCat(field(key), " is missing (the weight is double-quantised)"));
    if (!qs["nested_blocksize"].is_number_integer() || qs["nested_blocksize"].get<int64_t>() != kNf4NestedBlock)
      return absl::InvalidArgumentError(absl::StrCat(field("nested_blocksize"), ": ", qs["nested_blocksize"].dump(),
                                                     " is not supported (only ", kNf4NestedBlock, ")"));
    if (!qs["nested_offset"].is_number())
      return absl::InvalidArgumentError(absl::StrCat(field("nested_offset"), ": ", qs["nested_offset"].dump(), " is not a number"));
    if (qs.contains("nested_dtype") && qs["nested_dtype"] != "float32")
      return absl::InvalidArgumentError(absl::StrCat(field("nested_dtype"), ": ", qs["nested_dtype"].dump(), ", expected \"float32\""));
    w.offset = static_cast<float>(qs["nested_offset"].get<double>());
    auto nabs = load(weight_name + ".nested_absmax", DType::f32, (blocks + kNf4NestedBlock - 1) / kNf4NestedBlock);
    if (!nabs.ok()) return nabs.status();
    w.nested_absmax = *std::move(nabs);
    auto ncode = load(weight_name + ".nested_quant_map", DType::f32, 256);
    if (!ncode.ok()) return ncode.status();
    w.nested_code = *std::move(ncode);
  }
  return w;
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);  // shortest round trip
  std::string s(buf, r.ptr);
  const size_t e_pos = s.find('e');
  const int exp = std::stoi(s.substr(e_pos + 1));
  std::string mant = s.substr(0, e_pos);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char ch : mant)
    if (ch != '.') digits += ch;
  std::string out;
  if (exp < -4 || exp >= 16) {  // Python: 'r' format switches to exponent notation here
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    const int a = std::abs(exp);
    if (a < 10) out += "0";
    out += std::to_string(a);
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) out = digits + std::string(int_len - digits.size(), '0') + ".0";
    else out = digits.substr(0, int_len) + "." + digits.substr(int_len);
  }
  return neg ? "-" + out : out;
}

std::string nf4_quant_state_json(const Nf4Weight& w) {
  const char* dt = torch_dtype_name(w.dtype);
  LOOM_CHECK(dt, "nf4_quant_state_json: weight dtype ", name(w.dtype), " has no torch name");
  std::string shape = "[";
  for (size_t i = 0; i < w.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(w.shape[i]);
  shape += "]";
  // json.dumps with its default separators, keys in QuantState.as_dict's order.
  std::string s = absl::StrCat("{\"quant_type\": \"nf4\", \"blocksize\": ", w.blocksize, ", \"dtype\": \"", dt,
                               "\", \"shape\": ", shape);
  if (w.nested())
    absl::StrAppend(&s, ", \"nested_blocksize\": ", w.nested_blocksize, ", \"nested_dtype\": \"float32\", \"nested_offset\": ",
                    python_float_repr(static_cast<double>(w.offset)));
  return s + "}";
}

std::vector<std::pair<std::string, Tensor>> nf4_state_tensors(const std::string& weight_name, const Nf4Weight& w) {
  LOOM_CHECK(w.defined(), "nf4_state_tensors: undefined weight ", weight_name);
  std::vector<std::pair<std::string, Tensor>> out;
  const Tensor packed = w.packed.to(Device::cpu()).contiguous();
  out.emplace_back(weight_name, packed.view({packed.numel(), 1}));
  out.emplace_back(weight_name + ".absmax", w.absmax.to(Device::cpu()));
  out.emplace_back(weight_name + ".quant_map", Tensor::from_floats(std::vector<float>(w.code.begin(), w.code.end()), {16}));
  if (w.nested()) {
    out.emplace_back(weight_name + ".nested_absmax", w.nested_absmax.to(Device::cpu()));
    out.emplace_back(weight_name + ".nested_quant_map", w.nested_code.to(Device::cpu()));
  }
  const std::string json = nf4_quant_state_json(w);
  Tensor bytes = Tensor::empty({static_cast<int64_t>(json.size())}, DType::u8);
  std::memcpy(bytes.data<uint8_t>(), json.data(), json.size());
  out.emplace_back(weight_name + ".quant_state.bitsandbytes__nf4", bytes);
  return out;
}

}  // namespace loom
