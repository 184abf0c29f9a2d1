// `loom generate`: samples a continuation of a prompt, or the answer to a chat message rendered with
// the model's chat template, from a Hugging Face model or .gguf file (optionally with a PEFT LoRA
// adapter) with a KV cache, streaming the text as it is produced; tokens/s go to stderr.
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/gguf.h"
#include "models/generate.h"
#include "models/gguf_model.h"
#include "models/lora.h"
#include "train/data.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "text/tokenizer.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"model", false, "Hugging Face model folder (config.json, safetensors, tokenizer.json)", ""},
    {"adapter", false, "PEFT LoRA adapter folder to apply", ""},
    {"prompt", false, "the text to continue", ""},
    {"chat", false, "a user message: answered with the model's chat template, stopping at the end of the turn", ""},
    {"system", false, "a system message for --chat", ""},
    {"max-new-tokens", false, "tokens to generate at most", "128"},
    {"temperature", false, "sampling temperature (0 = greedy)", "0.7"},
    {"top-p", false, "nucleus sampling mass", "0.9"},
    {"seed", false, "sampling seed", "0"},
    {"device", false, "cpu, cuda or cuda:N", "cpu"},
    {"dtype", false, "f32 or bf16", "bf16"},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom generate: %s\n", std::string(s.message()).c_str());
  return 1;
}

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

int run_generate(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("generate", kFlags).c_str(), stdout);
    return 0;
  }
  if (!args->has("model")) return fail(absl::InvalidArgumentError("--model is required"));
  const bool chat = args->has("chat");
  if (chat == args->has("prompt")) return fail(absl::InvalidArgumentError("give one of --prompt TEXT or --chat MESSAGE"));
  if (args->has("system") && !chat) return fail(absl::InvalidArgumentError("--system goes with --chat"));
  auto device = parse_device(args->str("device"));
  if (!device.ok()) return fail(device.status());
  if (device->is_cuda() && device->index >= cuda_device_count())
    return fail(absl::InvalidArgumentError(absl::StrCat("--device ", device->str(), ": no such CUDA device")));
  const std::string dt = args->str("dtype");
  if (dt != "f32" && dt != "bf16") return fail(absl::InvalidArgumentError("--dtype must be f32 or bf16"));
  GenerateOptions opt;
  auto n = args->integer("max-new-tokens");
  auto temp = args->number("temperature");
  auto top_p = args->number("top-p");
  auto seed = args->integer("seed");
  for (const absl::Status& s : {n.status(), temp.status(), top_p.status(), seed.status()})
    if (!s.ok()) return fail(s);
  if (*n < 1 || *temp < 0 || *top_p <= 0 || *top_p > 1)
    return fail(absl::InvalidArgumentError("need --max-new-tokens >= 1, --temperature >= 0 and 0 < --top-p <= 1"));
  opt.max_new_tokens = *n;
  opt.temperature = static_cast<float>(*temp);
  opt.top_p = static_cast<float>(*top_p);
  opt.seed = static_cast<uint64_t>(*seed);

  auto tokenizer = Tokenizer::load(args->str("model"));
  if (!tokenizer.ok()) return fail(tokenizer.status());
  auto model = CausalLM::load(args->str("model"), {*dtype_from_name(dt), *device});
  if (!model.ok()) return fail(model.status());
  if (args->has("adapter"))
    if (auto lc = load_adapter(**model, args->str("adapter")); !lc.ok()) return fail(lc.status());
  // As `loom train` checks: a token the model has no embedding row for would be out of range.
  if (absl::Status s = tokenizer->fits_vocab((*model)->config().vocab_size); !s.ok())
    return fail(absl::InvalidArgumentError(absl::StrCat(args->str("model"), ": ", s.message())));
  for (int64_t id : (*model)->config().eos_token_ids) opt.stop_ids.push_back(static_cast<int32_t>(id));
  if (auto eos = tokenizer->eos_id()) opt.stop_ids.push_back(*eos);
  std::vector<int32_t> prompt;
  if (chat) {
    // The model's own template (a folder's, or a .gguf file's tokenizer.chat_template).
    auto tmpl = detect_chat_template(args->str("model"));
    if (!tmpl.ok()) return fail(tmpl.status());
    // Its end-of-turn markers, where the vocabulary has them.
    for (const std::string& end_of_turn : tmpl->end_of_turn())
      if (auto id = tokenizer->token_to_id(end_of_turn)) opt.stop_ids.push_back(*id);
    std::vector<ChatMessage> messages;
    if (args->has("system")) messages.push_back({"system", args->str("system")});
    messages.push_back({"user", args->str("chat")});
    auto rendered = render_chat(*tmpl, messages, /*add_generation_prompt=*/true);
    if (!rendered.ok()) return fail(rendered.status());
    // The template writes any BOS itself (as apply_chat_template, which tokenizes without specials).
    prompt = tokenizer->encode(rendered->text, /*add_special_tokens=*/false);
  } else {
    prompt = tokenizer->encode(args->str("prompt"), /*add_special_tokens=*/true);
  }
  if (prompt.empty()) return fail(absl::InvalidArgumentError("the prompt encodes to no tokens"));
  if (static_cast<int64_t>(prompt.size()) >= (*model)->config().max_position_embeddings)
    return fail(absl::OutOfRangeError(absl::StrCat("the prompt is ", prompt.size(), " tokens; the model's ",
                                                   "max_position_embeddings is ", (*model)->config().max_position_embeddings)));
  if (!chat) {
    std::fputs(args->str("prompt").c_str(), stdout);
    std::fflush(stdout);
  }
  std::vector<int32_t> produced;
  std::string shown;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto first = start;
  generate(**model, prompt, opt, [&](int32_t id) {
    if (produced.empty()) first = Clock::now();
    produced.push_back(id);
    const std::string text = tokenizer->decode(produced, /*skip_special_tokens=*/true);
    // Print only what is new, and only up to the last complete character.
    const size_t end = complete_utf8(text);
    if (end > shown.size() && text.compare(0, shown.size(), shown) == 0) {
      std::fwrite(text.data() + shown.size(), 1, end - shown.size(), stdout);
      std::fflush(stdout);
      shown = text.substr(0, end);
    }
  });
  const std::string text = tokenizer->decode(produced, /*skip_special_tokens=*/true);
  if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) std::fputs(text.c_str() + shown.size(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  const int64_t max_pos = (*model)->config().max_position_embeddings;
  if (static_cast<int64_t>(produced.size()) < opt.max_new_tokens &&
      static_cast<int64_t>(prompt.size() + produced.size()) >= max_pos)
    std::fprintf(stderr, "loom generate: stopped at the model's max_position_embeddings (%lld tokens with the prompt)\n",
                 static_cast<long long>(max_pos));
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  const double prefill = std::chrono::duration<double>(first - start).count();
  const double decode = total - prefill;
  std::fprintf(stderr, "loom generate: %zu tokens in %.2f s, %.1f tokens/s (prompt of %zu tokens in %.2f s)\n",
               produced.size(), total, produced.size() > 1 && decode > 0 ? (produced.size() - 1) / decode : 0.0,
               prompt.size(), prefill);
  return 0;
}

}  // namespace loom::cli
