// Mistral (MistralForCausalLM): Llama's block and weights without biases, with sliding-window
// attention on every layer (`sliding_window`, default 4096; null = none; transformers ignores a
// mistral `layer_types`, with a warning). llama.cpp has no mistral architecture for these models:
// convert_hf_to_gguf.py writes them as llama (dropping the window), and so does Loom.
#include "absl/strings/str_format.h"
#include "models/families/families.h"

namespace loom::families {

void llama_config_to_gguf(const ModelConfig& c, const std::string& p, GgufWriter& w);  // llama.cpp

// Mistral and Mixtral: llama.cpp's llama has no window.
std::string sliding_window_export_warning(const ModelConfig& c) {
  if (c.sliding_window <= 0) return "";
  return absl::StrFormat("written as llama (as llama.cpp converts %s), which attends to the whole context "
                         "instead of the sliding window of %d", c.family->name, c.sliding_window);
}

namespace {

void parse(const ConfigFields& f, ModelConfig& c) {
  c.attention_bias = c.o_proj_bias = c.mlp_bias = false;
  read_hidden_act(f, c);
  c.sliding_window = read_sliding_window(f, 4096);
  c.layer_is_sliding.assign(static_cast<size_t>(c.num_hidden_layers), c.sliding_window > 0);
}

}  // namespace

const FamilySpec& mistral() {
  static const FamilySpec spec = [] {
    FamilySpec s = llama();
    s.name = "mistral";
    s.model_types = {"mistral"};
    s.architectures = {"MistralForCausalLM"};
    s.default_max_position_embeddings = 4096 * 32;
    s.parse = parse;
    s.gguf_read_arch = "";  // a llama GGUF reads as llama
    s.gguf_write_arch = "llama";
    s.gguf_to_config = nullptr;
    s.config_to_gguf = llama_config_to_gguf;
    s.gguf_export_warning = sliding_window_export_warning;
    return s;
  }();
  return spec;
}

}  // namespace loom::families
