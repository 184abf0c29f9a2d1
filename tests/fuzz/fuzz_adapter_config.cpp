// libFuzzer: a PEFT adapter_config.json read by load_adapter into the tiny Llama fixture, next to the
// fixture's (valid) adapter_model.safetensors; a config that parses goes on to attach the adapter.
#include <filesystem>
#include <memory>

#include "models/causal_lm.h"
#include "models/lora.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<loom::CausalLM> model = [] {
    loom::LoadOptions o;
    o.dtype = loom::DType::f32;
    auto m = loom::CausalLM::load(loom::fuzz::fixture("models/llama"), o);
    LOOM_FUZZ_CHECK(m.ok());
    return *std::move(m);
  }();
  static const std::string dir = [] {
    std::string d = loom::fuzz::scratch_subdir("adapter");
    std::filesystem::copy_file(loom::fuzz::fixture("models/llama/adapter/adapter_model.safetensors"),
                               d + "/adapter_model.safetensors", std::filesystem::copy_options::overwrite_existing);
    return d;
  }();
  loom::fuzz::write_file(dir + "/adapter_config.json", data, size);
  auto config = loom::load_adapter(*model, dir);
  (void)config;
  return 0;
}
