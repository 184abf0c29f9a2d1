// `loom chat --model M [--adapter A]`: a multi-turn conversation in the terminal with the model's chat
// template, each answer streamed as it is generated. /reset starts over, /exit (or end of input)
// ends it; the oldest turns are dropped (the system message kept) when the conversation would no
// longer fit the context. Works with stdin a pipe: each line read is a user message.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/generation.h"

namespace loom::cli {
namespace {

std::vector<FlagSpec> flags() {
  std::vector<FlagSpec> f = generation_flags();
  f.insert(f.begin() + 2,
           {{"system", false, "a system message that opens the conversation (kept when old turns are dropped)", ""},
            {"max-context", false,
             "tokens of conversation kept, the answer included (default: the model's max_position_embeddings)", ""}});
  f.push_back({"help", true, "show this help", ""});
  return f;
}

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom chat: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int run_chat(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> kFlags = flags();
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("chat", kFlags).c_str(), stdout);
    std::fputs("\nIn the chat: a line is your message; /reset starts a new conversation; /exit or Ctrl-D ends it.\n",
               stdout);
    return 0;
  }
  auto m = load_generation_model(*args);
  if (!m.ok()) return fail(m.status());
  auto tmpl = load_chat_template(*m);
  if (!tmpl.ok()) return fail(tmpl.status());
  int64_t context = m->model->config().max_position_embeddings;
  if (args->has("max-context")) {
    auto n = args->integer("max-context");
    if (!n.ok()) return fail(n.status());
    if (*n < 2) return fail(absl::InvalidArgumentError("--max-context must be at least 2 tokens"));
    context = std::min(context, *n);
  }
  std::vector<ChatMessage> base;
  if (args->has("system")) base.push_back({"system", args->str("system")});
  const bool terminal = isatty(STDIN_FILENO);
  std::fprintf(stderr, "loom chat: %s, %s on %s, context %lld tokens. /reset starts over, /exit or Ctrl-D ends.\n",
               m->model->config().summary().c_str(), std::string(name(m->dtype)).c_str(), m->device.str().c_str(),
               static_cast<long long>(context));

  std::vector<ChatMessage> messages = base;
  int64_t turn = 0;  // answers in this conversation: the seed of answer k is --seed + k
  std::string line;
  while (true) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) {  // end of input: as /exit
      std::fputs("\n", stdout);
      break;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!terminal) std::printf("%s\n", line.c_str());  // a piped transcript shows what was said
    const std::string command(absl::StripAsciiWhitespace(line));
    if (command.empty()) continue;
    if (command == "/exit" || command == "/quit") break;
    if (command == "/reset") {
      messages = base;
      turn = 0;
      std::printf("(a new conversation)\n");
      continue;
    }
    messages.push_back({"user", line});
    // Drop the oldest exchanges (after the system message) until the prompt leaves room for an answer.
    std::vector<int32_t> prompt;
    while (true) {
      auto ids = chat_prompt(*m, *tmpl, messages);
      if (!ids.ok()) return fail(ids.status());
      prompt = *std::move(ids);
      const int64_t room = context - static_cast<int64_t>(prompt.size());
      if (room >= std::min<int64_t>(m->options.max_new_tokens, 1 + context / 4)) break;
      const size_t first = base.size();
      if (messages.size() - first <= 1) break;  // only the new message is left
      // The oldest user message and the answer after it.
      const size_t n = messages.size() - first >= 3 && messages[first + 1].role == "assistant" ? 2 : 1;
      messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(first),
                     messages.begin() + static_cast<std::ptrdiff_t>(first + n));
      std::fprintf(stderr, "loom chat: the conversation is longer than the context: its oldest turn is dropped\n");
    }
    if (static_cast<int64_t>(prompt.size()) >= context) {
      std::fprintf(stderr, "loom chat: this message is %zu tokens with the template: more than the context of %lld; "
                           "say it shorter\n", prompt.size(), static_cast<long long>(context));
      messages.pop_back();
      continue;
    }
    GenerateOptions opt = m->options;
    opt.seed = m->options.seed + static_cast<uint64_t>(turn++);
    opt.max_new_tokens = std::min<int64_t>(opt.max_new_tokens, context - static_cast<int64_t>(prompt.size()));
    const GenerationResult r = generate_streamed(*m, prompt, opt, stdout);
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[%zu tokens, %.1f tokens/s]\n", r.ids.size(), r.tokens_per_second());
    messages.push_back({"assistant", r.text});
  }
  return 0;
}

}  // namespace loom::cli
