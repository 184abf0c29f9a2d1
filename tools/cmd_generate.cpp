// `loom generate`: samples a continuation of a prompt, or the answer to a chat message rendered with
// the model's chat template, from a Hugging Face model or .gguf file (optionally with a PEFT LoRA
// adapter) with a KV cache, streaming the text as it is produced; tokens/s (and, with --show-prompt,
// the prompt as the model sees it) go to stderr.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/generation.h"

namespace loom::cli {
namespace {

std::vector<FlagSpec> flags() {
  std::vector<FlagSpec> f = generation_flags();
  f.insert(f.begin() + 2, {{"prompt", false, "the text to continue", ""},
                           {"chat", false, "a user message: answered with the model's chat template, stopping at the end "
                                           "of the turn (`loom chat` holds a whole conversation)", ""},
                           {"system", false, "a system message for --chat", ""},
                           {"show-prompt", true, "print the prompt the model is given (its tokens decoded, special "
                                                 "tokens included) to stderr first", ""}});
  f.push_back({"help", true, "show this help", ""});
  return f;
}

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom generate: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int run_generate(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> kFlags = flags();
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
  auto m = load_generation_model(*args);
  if (!m.ok()) return fail(m.status());
  std::vector<int32_t> prompt;
  if (chat) {
    auto tmpl = load_chat_template(*m);
    if (!tmpl.ok()) return fail(tmpl.status());
    std::vector<ChatMessage> messages;
    if (args->has("system")) messages.push_back({"system", args->str("system")});
    messages.push_back({"user", args->str("chat")});
    auto ids = chat_prompt(*m, *tmpl, messages);
    if (!ids.ok()) return fail(ids.status());
    prompt = *std::move(ids);
  } else {
    prompt = m->tokenizer->encode(args->str("prompt"), /*add_special_tokens=*/true);
  }
  if (prompt.empty()) return fail(absl::InvalidArgumentError("the prompt encodes to no tokens"));
  if (args->flag("show-prompt"))
    std::fprintf(stderr, "loom generate: the prompt (%zu tokens):\n%s\nloom generate: end of the prompt\n", prompt.size(),
                 m->tokenizer->decode(prompt).c_str());
  const int64_t max_pos = m->model->config().max_position_embeddings;
  if (static_cast<int64_t>(prompt.size()) >= max_pos)
    return fail(absl::OutOfRangeError(absl::StrCat("the prompt is ", prompt.size(), " tokens; the model's ",
                                                   "max_position_embeddings is ", max_pos)));
  if (!chat) {
    std::fputs(args->str("prompt").c_str(), stdout);
    std::fflush(stdout);
  }
  const GenerationResult r = generate_streamed(*m, prompt, m->options, stdout);
  std::printf("\n");
  std::fflush(stdout);
  if (static_cast<int64_t>(r.ids.size()) < m->options.max_new_tokens &&
      static_cast<int64_t>(prompt.size() + r.ids.size()) >= max_pos)
    std::fprintf(stderr, "loom generate: stopped at the model's max_position_embeddings (%lld tokens with the prompt)\n",
                 static_cast<long long>(max_pos));
  std::fprintf(stderr, "loom generate: %zu tokens in %.2f s, %.1f tokens/s (prompt of %zu tokens in %.2f s; %s on %s)\n",
               r.ids.size(), r.seconds, r.tokens_per_second(), prompt.size(), r.prefill_seconds,
               std::string(name(m->dtype)).c_str(), m->device.str().c_str());
  return 0;
}

}  // namespace loom::cli
