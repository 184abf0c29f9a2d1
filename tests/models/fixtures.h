// Reading the reference fixtures made by tools/reference/make_reference.py (tests/fixtures/models/<variant>).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/tensor_io.h"
#include "nlohmann/json.hpp"

namespace loom::test {

inline std::string fixture_dir(const std::string& variant) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/models/" + variant;
}

inline const std::vector<std::string>& fixture_variants() {
  static const std::vector<std::string> v = {"llama", "llama_tied_bf16", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
                                                "phi3",  "phi3_longrope",   "phi3_longrope_below"};
  return v;
}

// Every tensor of a safetensors file, copied to owned CPU tensors.
inline std::map<std::string, Tensor> read_all(const std::string& path) {
  auto t = load_tensors(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : std::map<std::string, Tensor>{};
}

// A copy of fixture `variant` in `dir`: its config.json merge-patched (a null removes a key) and its
// weights, the decoder layers repeated to `layers` of them (layer i holds the fixture's layer i % n;
// 0 keeps them as they are).
inline void copy_fixture(const std::string& variant, const std::string& dir, const nlohmann::json& patch,
                         int64_t layers = 0) {
  std::ifstream in(fixture_dir(variant) + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  const int64_t n = config.at("num_hidden_layers");
  config.merge_patch(patch);
  if (layers > 0) config["num_hidden_layers"] = layers;
  std::ofstream(dir + "/config.json") << config.dump(2);
  std::vector<std::pair<std::string, Tensor>> out;
  const std::string kLayers = "model.layers.";
  for (const auto& [name, t] : read_all(fixture_dir(variant) + "/model.safetensors")) {
    if (layers == 0 || !name.starts_with(kLayers)) {
      out.emplace_back(name, t);
      continue;
    }
    const size_t dot = name.find('.', kLayers.size());
    const int64_t layer = std::stoll(name.substr(kLayers.size(), dot - kLayers.size()));
    for (int64_t i = layer; i < layers; i += n) out.emplace_back(absl::StrCat(kLayers, i, name.substr(dot)), t);
  }
  EXPECT_TRUE(save_tensors(dir + "/model.safetensors", out).ok());
}

// The gemma3 fixture's changes for llama.cpp's gemma3 to hold it: every layer but each 6th slides
// (both of its two layers) and the attention scale is head_dim^-0.5 (16, not 24).
inline nlohmann::json gemma3_llama_cpp_patch() {
  return {{"layer_types", {"sliding_attention", "sliding_attention"}}, {"sliding_window_pattern", 6},
          {"_sliding_window_pattern", nullptr}, {"query_pre_attn_scalar", 16}};
}

// ||a - b|| / ||b|| over float tensors on any device.
inline double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  const auto x = a.to_doubles(), y = b.to_doubles();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace loom::test
