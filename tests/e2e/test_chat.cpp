// `loom chat` with stdin a pipe: the transcript (each message echoed after "> ", the answer on the
// lines after it), /reset starting a new conversation whose answer is the one-turn answer `loom
// generate --chat` gives at temperature 0, /exit and end of input ending it, and the oldest turns
// dropped (the system message kept) when the conversation outgrows --max-context.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include <array>
#include <cstdio>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {

// tiny_llama.gguf: a random 3-layer llama with a 66-token BPE vocabulary, a ChatML template and a
// 128-token context.
const std::string kModel = kSrc + "/tests/fixtures/gguf/tiny_llama.gguf";
const std::string kFlags = " --temperature 0 --max-new-tokens 10";

// stdout of `loom <args>` with `input` on its stdin (stderr dropped, or kept in *err).
RunResult run_piped(const std::string& input, const std::string& args, std::string* err = nullptr) {
  const std::string err_file = ::testing::TempDir() + "loom_chat_stderr_" + std::to_string(getpid());
  const std::string cmd = "printf '" + input + "' | " + LOOM_BINARY + " " + args + " 2>" + err_file;
  RunResult r = run_command(cmd);
  if (err) {
    std::ifstream f(err_file, std::ios::binary);
    err->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  std::remove(err_file.c_str());
  return r;
}

// The answer `loom generate --chat` prints for one message (its stdout without the final newline).
std::string one_turn_answer(const std::string& message, const std::string& extra = "") {
  RunResult r = run_piped("", "generate --model " + kModel + " --chat '" + message + "'" + kFlags + extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(r.output.ends_with("\n")) << r.output;
  return r.output.substr(0, r.output.size() - 1);
}

TEST(Chat, PipedTranscriptResetAndExit) {
  const std::string hello = one_turn_answer("hello"), hi = one_turn_answer("hi");
  ASSERT_NE(hello, hi);  // else the comparison below could not tell the turns apart
  RunResult r = run_piped("hello\\n/reset\\nhi\\n/exit\\nnever read\\n", "chat --model " + kModel + kFlags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The first answer is the one-turn answer; after /reset the conversation starts again, so the
  // answer to "hi" is the one-turn answer too (with "hello" still in the history it would differ).
  EXPECT_EQ(r.output, "> hello\n" + hello + "\n> /reset\n(a new conversation)\n> hi\n" + hi + "\n> /exit\n");
  // Without /reset, "hi" is answered in the context of the first exchange.
  r = run_piped("hello\\nhi\\n", "chat --model " + kModel + kFlags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string head = "> hello\n" + hello + "\n> hi\n";
  ASSERT_TRUE(r.output.starts_with(head)) << r.output;
  EXPECT_TRUE(r.output.ends_with("\n> \n")) << r.output;  // end of input: as /exit
  EXPECT_NE(r.output.substr(head.size()), hi + "\n> \n") << "the second turn ignored the first";
  // --system opens the conversation as in generate --chat --system.
  r = run_piped("hello\\n", "chat --model " + kModel + kFlags + " --system 'Be brief.'");
  EXPECT_EQ(r.output, "> hello\n" + one_turn_answer("hello", " --system 'Be brief.'") + "\n> \n");
}

TEST(Chat, OldestTurnsAreDroppedToFitTheContext) {
  std::string input;
  for (int i = 0; i < 6; ++i) input += "tell me more about weaving\\n";
  std::string err;
  RunResult r = run_piped(input, "chat --model " + kModel + kFlags + " --system 'Be brief.' --max-context 60", &err);
  ASSERT_EQ(r.exit_code, 0) << r.output << err;
  EXPECT_NE(err.find("its oldest turn is dropped"), std::string::npos) << err;
  EXPECT_NE(err.find("context 60 tokens"), std::string::npos) << err;
  // 60 tokens hold the system message and one exchange of this tokenizer's near-byte tokens: every
  // turn is trimmed to [system, message], so each answer is the one-turn answer with the system
  // message (which differs from the answer without it: the system message was kept).
  const std::string message = "tell me more about weaving";
  const std::string with_system = one_turn_answer(message, " --system 'Be brief.'");
  ASSERT_NE(with_system, one_turn_answer(message));
  std::string want;
  for (int i = 0; i < 6; ++i) want += "> " + message + "\n" + with_system + "\n";
  EXPECT_EQ(r.output, want + "> \n");
  // A message longer than the context alone is refused for that turn; the chat goes on.
  std::string long_message;
  for (int i = 0; i < 40; ++i) long_message += "weave ";
  err.clear();
  r = run_piped(long_message + "\\nhello\\n", "chat --model " + kModel + kFlags + " --max-context 30", &err);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(err.find("more than the context of 30"), std::string::npos) << err;
  EXPECT_TRUE(r.output.find("> hello\n") != std::string::npos) << r.output;
}

TEST(Chat, BadFlagsAreErrors) {
  RunResult r = run_piped("", "chat --model " + kModel + " --max-context 1");
  EXPECT_EQ(r.exit_code, 1);
  r = run_loom("chat --model /nonexistent.gguf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/nonexistent.gguf"), std::string::npos) << r.output;
  r = run_loom("chat --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("/reset"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
