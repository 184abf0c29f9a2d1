// `loom quantize --model DIR --out DIR`: a bf16/f16/f32 Hugging Face model rewritten as the 4-bit
// checkpoint transformers + bitsandbytes save (NF4, double quantisation; models/bnb_checkpoint.h).
// Weights are read and quantised one at a time; the folder is built in a staging folder and its
// files moved into --out at the end (tools/outputs.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/device.h"
#include "engine/json_file.h"
#include "engine/ops.h"
#include "engine/safetensors.h"
#include "models/bnb_checkpoint.h"
#include "models/checkpoint.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/outputs.h"

namespace loom::cli {
namespace {
namespace fs = std::filesystem;

const std::vector<FlagSpec> kFlags = {
    {"model", false, "Hugging Face model folder (bf16, f16 or f32 safetensors)", ""},
    {"out", false, "output Hugging Face folder (4-bit model.safetensors, config.json with its quantization_config, tokenizer files)", ""},
    {"device", false, "cpu, cuda or cuda:N (where the weights are quantised)", "cpu"},
    {"compute-dtype", false, "bnb_4bit_compute_dtype written to config.json: bfloat16, float16 or float32", "bfloat16"},
    {"overwrite", true, kOverwriteHelp, ""},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom quantize: %s\n", std::string(s.message()).c_str());
  return 1;
}

// The files besides the weights and config.json that make the folder a usable model.
bool is_side_file(const std::string& name) {
  for (const char* f : {"generation_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
                        "merges.txt", "chat_template.jinja", "chat_template.json"})
    if (name == f) return true;
  return absl::StartsWith(name, "tokenizer");
}

// Written into the staging folder, whose files are moved into --out together.
absl::Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.flush();
  if (!out) return absl::InternalError(absl::StrCat(path.string(), ": cannot write"));
  return absl::OkStatus();
}

absl::Status quantize_folder(const std::string& model_dir, const fs::path& tmp, Device device,
                             const std::string& compute_dtype, int* quantized, int64_t* bytes_in, int64_t* bytes_out) {
  const std::string config_path = (fs::path(model_dir) / "config.json").string();
  auto parsed = read_json_file(config_path);
  if (!parsed.ok()) return parsed.status();
  nlohmann::json config = *std::move(parsed);
  if (!config.is_object()) return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  if (config.contains("quantization_config"))
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": the model is already quantised (it has a quantization_config)"));
  auto ckpt = Checkpoint::open(model_dir);
  if (!ckpt.ok()) return ckpt.status();

  // Dense tensors go through byte for byte from the source mapping (kept open until written).
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
  std::vector<std::pair<std::string, Tensor>> owned;  // quantised state, on the CPU
  std::vector<TensorToWrite> entries;
  std::vector<std::pair<std::string, const TensorInfo*>> dense;
  for (const std::string& name : ckpt->names()) {
    const TensorInfo* info = ckpt->find(name);
    *bytes_in += static_cast<int64_t>(info->nbytes);
    if (bnb_quantizes(name) && info->shape.size() == 2 && is_float(info->dtype)) {
      // bf16 stays bf16; f32, f16 and f64 are read as f32 (f16 exactly) and quantised from there.
      const DType load_as = info->dtype == DType::bf16 ? DType::bf16 : DType::f32;
      auto w = ckpt->load(name, load_as, device);
      if (!w.ok()) return w.status();
      // inf or nan would give an infinite nested offset that no loader accepts (beyond ~1e19 the
      // square overflows too: no trained weight is that large).
      if (!std::isfinite(ops::sum_squares(*w).to(Device::cpu()).to(DType::f32).item()))
        return absl::InvalidArgumentError(absl::StrCat(ckpt->file_of(name), ": tensor ", name,
                                                       " holds inf or nan values: it cannot be quantised"));
      const DType recorded = info->dtype == DType::f64 ? DType::f32 : info->dtype;
      for (auto& t : nf4_state_tensors(name, Nf4Weight::quantize(*w, recorded))) owned.push_back(std::move(t));
      ++*quantized;
      continue;
    }
    const std::string path = ckpt->file_of(name);
    auto& f = files[path];
    if (!f) {
      auto opened = SafetensorsFile::open(path);
      if (!opened.ok()) return opened.status();
      f = std::make_shared<SafetensorsFile>(*std::move(opened));
    }
    dense.emplace_back(name, f->find(name));
    entries.push_back({name, info->dtype, info->shape, f->bytes(*f->find(name))});
  }
  if (*quantized == 0) return absl::InvalidArgumentError(absl::StrCat(model_dir, ": no decoder Linear weight (q/k/v/o/gate/up/down_proj) to quantise"));
  for (const auto& [name, t] : owned) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    entries.push_back({name, t.dtype(), t.shape(), std::span<const uint8_t>(p, static_cast<size_t>(t.nbytes()))});
    *bytes_out += t.nbytes();
  }
  for (const auto& [name, info] : dense) *bytes_out += static_cast<int64_t>(info->nbytes);
  if (absl::Status s = write_safetensors((tmp / "model.safetensors").string(), entries, {{"format", "pt"}}); !s.ok())
    return s;

  BnbQuantConfig qc;
  qc.compute_dtype = compute_dtype;
  config["quantization_config"] = bnb_quant_config_json(qc);
  if (absl::Status s = write_text(tmp / "config.json", config.dump(2) + "\n"); !s.ok()) return s;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec)) {
    const std::string fname = e.path().filename().string();
    if (!e.is_regular_file() || !is_side_file(fname)) continue;
    fs::copy_file(e.path(), tmp / fname, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", e.path().string(), ": ", ec.message()));
  }
  if (ec) return absl::InternalError(absl::StrCat(model_dir, ": cannot list the folder: ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

int run_quantize(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("quantize", kFlags).c_str(), stdout);
    return 0;
  }
  for (const char* required : {"model", "out"})
    if (!args->has(required)) return fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
  auto device = parse_device(args->str("device"));
  if (!device.ok()) return fail(device.status());
  if (device->is_cuda() && device->index >= cuda_device_count())
    return fail(absl::InvalidArgumentError(absl::StrCat("--device ", device->str(), ": no such CUDA device")));
  const std::string compute = args->str("compute-dtype");
  if (compute != "bfloat16" && compute != "float16" && compute != "float32")
    return fail(absl::InvalidArgumentError(absl::StrCat("--compute-dtype ", compute, ": expected bfloat16, float16 or float32")));
  const fs::path out = fs::path(args->str("out"));
  if (absl::Status s = check_out_folder("--out", out.string(), args->flag("overwrite")); !s.ok()) return fail(s);
  if (absl::Status s = check_not_over_inputs("--out", out.string(), {{"--model", args->str("model")}}, /*inside=*/false);
      !s.ok())
    return fail(s);
  auto staged = StagedFolder::create(out.string());
  if (!staged.ok()) return fail(staged.status());
  int quantized = 0;
  int64_t bytes_in = 0, bytes_out = 0;
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = quantize_folder(args->str("model"), staged->dir(), *device, compute, &quantized, &bytes_in, &bytes_out);
  if (s.ok()) s = staged->commit();
  if (!s.ok()) return fail(s);
  // Read, quantised on --device and written, in wall time (the input's bytes over it).
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("loom quantize: %s -> %s (%d weights in NF4 with double quantisation; tensors %.1f MB -> %.1f MB) "
              "in %.1f s (%.2f GB/s read)\n",
              args->str("model").c_str(), out.string().c_str(), quantized, bytes_in / 1e6, bytes_out / 1e6, secs,
              bytes_in / 1e9 / std::max(secs, 1e-9));
  return 0;
}

}  // namespace loom::cli
