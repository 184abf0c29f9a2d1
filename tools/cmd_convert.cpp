// `loom convert --gguf FILE --out DIR`: a llama.cpp GGUF model written as the Hugging Face folder it
// stands for (config.json, model.safetensors, generation_config.json, tokenizer files, and a
// README.md model card with the GGUF's license, languages and base model).

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "engine/tensor_io.h"
#include "engine/text_file.h"
#include "models/causal_lm.h"
#include "models/gguf_model.h"
#include "models/gguf_provenance.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/outputs.h"
#include "text/gguf_tokenizer.h"
#include "text/tokenizer.h"

namespace loom::cli {
namespace {
namespace fs = std::filesystem;

const std::vector<FlagSpec> kFlags = {
    {"gguf", false, "the .gguf file of a family Loom reads from GGUF (README: model families)", ""},
    {"out", false, "output Hugging Face folder (config.json, model.safetensors, tokenizer files)", ""},
    {"dtype", false, "storage dtype of the written weights: bf16 or f32 (they are dequantised to f32 first)", "bf16"},
    {"overwrite", true, kOverwriteHelp, ""},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom convert: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int run_convert(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("convert", kFlags).c_str(), stdout);
    return 0;
  }
  for (const char* required : {"gguf", "out"})
    if (!args->has(required)) return fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
  const std::string dtype_name = args->str("dtype");
  if (dtype_name != "bf16" && dtype_name != "f32")
    return fail(absl::InvalidArgumentError(absl::StrCat("--dtype ", dtype_name, ": expected bf16 or f32")));
  const DType dtype = dtype_name == "bf16" ? DType::bf16 : DType::f32;
  const std::string src = args->str("gguf");
  const fs::path out = args->str("out");
  if (absl::Status s = check_out_folder("--out", out.string(), args->flag("overwrite")); !s.ok()) return fail(s);

  auto file = GgufFile::open(src);
  if (!file.ok()) return fail(file.status());
  auto config_json = gguf_hf_config(*file);
  if (!config_json.ok()) return fail(config_json.status());
  auto config = ModelConfig::from_json_text(config_json->dump(), src + " (GGUF metadata)");
  if (!config.ok()) return fail(config.status());
  auto tensors = gguf_hf_tensors(*file, *config);
  if (!tensors.ok()) return fail(tensors.status());
  // Before writing anything: inconsistent tokenizer metadata is an error; a tokenizer kind Loom
  // cannot convert yet (or none at all) leaves the folder without tokenizer files, with a warning.
  auto tokenizer = gguf_hf_tokenizer(*file);
  if (!tokenizer.ok() && tokenizer.status().code() == absl::StatusCode::kInvalidArgument) return fail(tokenizer.status());
  if (!tokenizer.ok())
    std::fprintf(stderr, "loom convert: warning: no tokenizer files written: %s\n",
                 std::string(tokenizer.status().message()).c_str());

  (*config_json)["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
  // Every text first: a JSON dump throws on invalid UTF-8 (a token's text, say) and nothing may be
  // half-written by then.
  std::vector<std::pair<std::string, std::string>> texts;
  try {
    texts.emplace_back("config.json", config_json->dump(2) + "\n");
    texts.emplace_back("generation_config.json", gguf_generation_config(*file).dump(2) + "\n");
    // The GGUF's license, languages, base model... as a model card the Hub (and loom export) reads.
    if (std::string card = gguf_model_card(*file); !card.empty()) texts.emplace_back("README.md", std::move(card));
    if (tokenizer.ok()) {
      texts.emplace_back("tokenizer.json", tokenizer->tokenizer_json.dump(2) + "\n");
      texts.emplace_back("tokenizer_config.json", tokenizer->tokenizer_config_json.dump(2) + "\n");
    }
  } catch (const nlohmann::json::exception& e) {
    return fail(absl::InvalidArgumentError(absl::StrCat(src, ": its metadata cannot be written as JSON (", e.what(),
                                                        "): a token's text that is not UTF-8?")));
  }
  // Built in a staging folder, loaded back (weights against the config, the tokenizer) and only
  // then moved into --out: a GGUF whose tensors contradict its metadata leaves nothing behind.
  auto staged = StagedFolder::create(out.string());
  if (!staged.ok()) return fail(staged.status());
  const fs::path tmp = staged->dir();
  auto written = [&]() -> absl::Status {
    std::vector<std::pair<std::string, Tensor>> named;
    for (auto& [name, t] : *tensors) named.emplace_back(name, t);
    LOOM_RETURN_IF_ERROR(save_tensors((tmp / "model.safetensors").string(), named, dtype, {{"format", "pt"}}));
    for (const auto& [name, text] : texts) LOOM_RETURN_IF_ERROR(write_text_atomic((tmp / name).string(), text));
    if (auto back = CausalLM::load(tmp.string(), {dtype, Device::cpu()}); !back.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": the converted model does not load: ", back.status().message()));
    if (tokenizer.ok())
      if (auto tok = Tokenizer::load(tmp.string()); !tok.ok())
        return absl::InvalidArgumentError(
            absl::StrCat(src, ": the converted tokenizer does not load: ", tok.status().message()));
    return staged->commit();
  }();
  if (!written.ok()) return fail(written);
  const size_t count = tensors->size();
  std::printf("loom convert: %s -> %s (%s, %zu tensors; %s)\n", src.c_str(), out.string().c_str(), dtype_name.c_str(),
              count, config->summary().c_str());
  return 0;
}

}  // namespace loom::cli
