// `loom train` on the shipped Alpaca and ShareGPT samples (examples/data) for a couple of steps, and
// `loom tokenize --show` marking the trained spans with [[ ]] when stdout is not a terminal.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"
#include "text/tokenizer.h"

namespace loom::test {
namespace {

std::string train_on(const std::string& data, const std::string& out, const std::string& extra = "") {
  return "train --model " + base_model() + " --data " + data + " --out " + out +
         " --seq-len 64 --batch-size 2 --max-steps 2 --lr 1e-3 --lora-r 4 --lora-alpha 8 --dtype f32" + extra;
}

TEST(TrainFormats, AlpacaAndShareGptFilesTrain) {
  for (const char* name : {"alpaca_sample", "sharegpt_sample"}) {
    SCOPED_TRACE(name);
    const std::string out = fresh_dir(std::string("formats_") + name);
    RunResult r = run_loom(train_on(kSrc + "/examples/data/" + name + ".jsonl", out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto losses = metric_losses(out);
    ASSERT_EQ(losses.size(), 2u) << r.output;
    for (double l : losses) EXPECT_TRUE(std::isfinite(l) && l > 0) << l;
    // The demo model has no chat template: ShareGPT falls back to ChatML (said), Alpaca to its own
    // prompt (no conversation rendered, nothing to say).
    const bool said = r.output.find("plain ChatML") != std::string::npos;
    EXPECT_EQ(said, std::string(name) == "sharegpt_sample") << r.output;
  }
}

TEST(TrainFormats, TokenizeShowMarksTrainedSpans) {
  const std::string dir = fresh_dir("formats_show");
  std::filesystem::create_directories(dir);
  const std::string data = dir + "/data.jsonl";
  std::ofstream(data) << R"({"instruction": "Say hi.", "output": "Hi!"})" << "\n"
                      << R"({"conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Hey"}]})"
                      << "\n";
  const std::string tok = kSrc + "/tests/fixtures/tokenizers/qwen2/tokenizer.json";
  RunResult r = run_loom("tokenize --tokenizer " + tok + " --input " + data + " --show --chat-template chatml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // ChatML as transformers documents it; the counts from the tokenizer on that text.
  auto t = Tokenizer::load(tok);
  ASSERT_TRUE(t.ok()) << t.status();
  std::string want;
  for (auto [user, reply] : {std::pair{"Say hi.", "Hi!"}, std::pair{"Hello", "Hey"}}) {
    const std::string prompt = std::string("<|im_start|>user\n") + user + "<|im_end|>\n<|im_start|>assistant\n";
    const std::string answer = std::string(reply) + "<|im_end|>";
    want += "--- record " + std::to_string(want.empty() ? 1 : 2) + ": " +
            std::to_string(t->encode(prompt + answer + "\n").size()) + " tokens, " +
            std::to_string(t->encode(answer).size()) + " trained ---\n" + prompt + "[[" + answer + "]]\n";
  }
  EXPECT_EQ(r.output, want);
  // The ids output is unchanged without --show.
  r = run_loom("tokenize --tokenizer " + tok + " --input " + data + " --chat-template chatml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output[0], '[') << r.output;
  // A bad ShareGPT role names the line and the value.
  std::ofstream(data) << R"({"conversations": [{"from": "narrator", "value": "x"}]})" << "\n";
  r = run_loom("tokenize --tokenizer " + tok + " --input " + data + " --show --chat-template chatml");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(data + ":1: conversations[0].from is \"narrator\""), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
