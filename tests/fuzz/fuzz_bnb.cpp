// libFuzzer: bitsandbytes 4-bit checkpoints: config.json's quantization_config (inputs that start
// with '{') or a model.safetensors whose 4-bit weights (packed bytes, absmax, quant_map, nested
// statistics and the quant_state JSON) load_nf4 reads.
#include <string>

#include "models/bnb_checkpoint.h"
#include "models/checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == '{') {
    nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
    if (j.is_discarded()) return 0;
    auto c = loom::parse_bnb_quant_config(j, "config.json");
    if (c.ok() && c->has_value()) {
      for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "lm_head.weight", "model.embed_tokens.weight"})
        (void)loom::bnb_quantizes(name, &**c);
    }
    return 0;
  }
  static const std::string dir = loom::fuzz::scratch_subdir("bnb_model");
  loom::fuzz::write_file(dir + "/model.safetensors", data, size);
  auto ckpt = loom::Checkpoint::open(dir);
  if (!ckpt.ok()) return 0;
  for (const std::string& name : ckpt->names()) {
    if (!loom::is_nf4(*ckpt, name)) continue;
    auto w = loom::load_nf4(*ckpt, name, {}, loom::Device::cpu());
    (void)w;
  }
  return 0;
}
