// Reading the reference fixtures made by tools/make_reference.py (tests/fixtures/models/<variant>).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "engine/tensor_io.h"

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
