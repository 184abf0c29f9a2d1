// Loading and streaming shared by `loom generate` and `loom chat` (see generation.h).
#include "tools/generation.h"

#include <chrono>
#include <iostream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "models/lora.h"
#include "tools/device_map_flags.h"
#include "tools/outputs.h"

namespace loom::cli {
namespace {

// Bytes of `s` up to the end of its last complete UTF-8 character: a byte-level token can end in the
// middle of one, which the next token completes.
size_t complete_utf8(const std::string& s) {
  size_t end = s.size();
  for (size_t back = 1; back <= 4 && back <= s.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    if (need > back) end = s.size() - back;
    break;
  }
  // The tokenizer's lossy decode shows an unfinished sequence as U+FFFD: hold it back too.
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  if (std::string_view(s.data(), end).ends_with(kReplacement)) end -= kReplacement.size();
  return end;
}

}  // namespace

std::vector<FlagSpec> generation_flags() {
  return {
      {"model", false, "Hugging Face model folder (config.json, safetensors, tokenizer.json) or .gguf file", ""},
      {"adapter", false, "PEFT LoRA adapter folder to apply", ""},
      {"max-new-tokens", false, "tokens to generate at most (per answer)", "128"},
      {"temperature", false, "sampling temperature (0 = greedy)", "0.7"},
      {"top-p", false, "nucleus sampling mass", "0.9"},
      {"seed", false, "sampling seed", "0"},
      {"device", false, "cpu, cuda or cuda:N", "cpu"},
      {"dtype", false, kDtypeHelp, ""},
      {"allow-nonfinite", true, kAllowNonfiniteHelp, ""},
      device_map_flags()[0],
      device_map_flags()[1],
  };
}

absl::StatusOr<GenerationModel> load_generation_model(const Args& args) {
  if (!args.has("model")) return absl::InvalidArgumentError("--model is required");
  GenerationModel m;
  m.path = args.str("model");
  auto device = parse_device(args.str("device"));
  if (!device.ok()) return device.status();
  if (device->is_cuda() && device->index >= cuda_device_count())
    return absl::InvalidArgumentError(absl::StrCat("--device ", device->str(), ": no such CUDA device"));
  m.device = *device;
  auto dtype = dtype_flag(args, m.device);
  if (!dtype.ok()) return dtype.status();
  m.dtype = *dtype;
  auto n = args.integer("max-new-tokens");
  auto temp = args.number("temperature");
  auto top_p = args.number("top-p");
  auto seed = args.integer("seed");
  for (const absl::Status& s : {n.status(), temp.status(), top_p.status(), seed.status()})
    if (!s.ok()) return s;
  if (*n < 1 || *temp < 0 || *top_p <= 0 || *top_p > 1)
    return absl::InvalidArgumentError("need --max-new-tokens >= 1, --temperature >= 0 and 0 < --top-p <= 1");
  m.options.max_new_tokens = *n;
  m.options.temperature = static_cast<float>(*temp);
  m.options.top_p = static_cast<float>(*top_p);
  m.options.seed = static_cast<uint64_t>(*seed);

  auto tokenizer = Tokenizer::load(m.path);
  if (!tokenizer.ok()) return tokenizer.status();
  m.tokenizer = std::make_unique<Tokenizer>(*std::move(tokenizer));
  LoadOptions lo{m.dtype, m.device, false, args.flag("allow-nonfinite")};
  auto placement = placement_from_flags(args, m.path, m.dtype, false);
  if (!placement.ok()) return placement.status();
  lo.placement = *placement;
  auto model = CausalLM::load(m.path, lo);
  if (!model.ok()) return model.status();
  m.model = *std::move(model);
  for (const std::string& note : m.model->load_notes()) std::cerr << "note: " << note << "\n";  // e.g. a skipped vision tower
  if (args.has("adapter"))
    if (auto lc = load_adapter(*m.model, args.str("adapter")); !lc.ok()) return lc.status();
  // As `loom train` checks: a token the model has no embedding row for would be out of range.
  if (absl::Status s = m.tokenizer->fits_vocab(m.model->config().vocab_size); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat(m.path, ": ", s.message()));
  for (int64_t id : m.model->config().eos_token_ids) m.options.stop_ids.push_back(static_cast<int32_t>(id));
  if (auto eos = m.tokenizer->eos_id()) m.options.stop_ids.push_back(*eos);
  return m;
}

absl::StatusOr<ChatTemplate> load_chat_template(GenerationModel& m) {
  auto tmpl = detect_chat_template(m.path);
  if (!tmpl.ok()) return tmpl.status();
  for (const std::string& end_of_turn : tmpl->end_of_turn())
    if (auto id = m.tokenizer->token_to_id(end_of_turn)) m.options.stop_ids.push_back(*id);
  return tmpl;
}

absl::StatusOr<std::vector<int32_t>> chat_prompt(const GenerationModel& m, const ChatTemplate& t,
                                                 const std::vector<ChatMessage>& messages) {
  auto rendered = render_chat(t, messages, /*add_generation_prompt=*/true);
  if (!rendered.ok()) return rendered.status();
  return m.tokenizer->encode(rendered->text, /*add_special_tokens=*/false);
}

double GenerationResult::tokens_per_second() const {
  const double decode = seconds - prefill_seconds;
  return ids.size() > 1 && decode > 0 ? static_cast<double>(ids.size() - 1) / decode : 0.0;
}

GenerationResult generate_streamed(const GenerationModel& m, const std::vector<int32_t>& prompt,
                                   const GenerateOptions& options, std::FILE* out) {
  GenerationResult r;
  std::string shown;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto first = start;
  generate(*m.model, prompt, options, [&](int32_t id) {
    if (r.ids.empty()) first = Clock::now();
    r.ids.push_back(id);
    const std::string text = m.tokenizer->decode(r.ids, /*skip_special_tokens=*/true);
    // Print only what is new, and only up to the last complete character.
    const size_t end = complete_utf8(text);
    if (end > shown.size() && text.compare(0, shown.size(), shown) == 0) {
      std::fwrite(text.data() + shown.size(), 1, end - shown.size(), out);
      std::fflush(out);
      shown = text.substr(0, end);
    }
  });
  r.text = m.tokenizer->decode(r.ids, /*skip_special_tokens=*/true);
  if (r.text.size() > shown.size() && r.text.compare(0, shown.size(), shown) == 0)
    std::fputs(r.text.c_str() + shown.size(), out);
  std::fflush(out);
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.prefill_seconds = std::chrono::duration<double>(first - start).count();
  return r;
}

}  // namespace loom::cli
