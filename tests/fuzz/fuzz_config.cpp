// libFuzzer: Hugging Face config.json (every family, transformers 4.x rope_theta/rope_scaling and
// 5.x rope_parameters) through ModelConfig::from_json_text: a config or an absl::Status, nothing else.
#include <string>

#include "models/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = loom::ModelConfig::from_json_text(text, "config.json");
  (void)config;
  return 0;
}
