// `loom train --eval-data`: the held-out loss after the last step equals a reference computed here
// from the saved adapter without the trainer's packing, fused loss or batching (each document
// forwarded alone, its next-token cross-entropy taken in f64 from the logits over its target
// tokens); it is written on the steps --eval-every names and after the last; bad flags and files are
// clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "models/lora.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"
#include "train/data.h"

namespace loom::test {
namespace {

const std::string kData = kSrc + "/examples/demo/weaving.jsonl";

// Three documents shorter than --seq-len (so no document is split across rows), one of them a
// prompt/completion pair whose prompt tokens take no loss.
std::string write_eval_file() {
  const std::string path = fresh_dir("eval_data") + ".jsonl";
  std::ofstream(path) << R"({"text": "The weaver counted the warp threads twice before the shuttle flew."})" << "\n"
                      << R"({"prompt": "What holds the warp? ", "completion": "The back beam and the front beam."})" << "\n"
                      << R"({"text": "Blue wool, then grey, then blue again."})" << "\n";
  return path;
}

std::string eval_args(const std::string& out, const std::string& eval) {
  return "train --model " + base_model() + " --data " + kData + " --eval-data " + eval + " --out " + out +
         " --seq-len 128 --batch-size 2 --max-steps 4 --eval-every 2 --lr 5e-3 --lora-r 8 --lora-alpha 16" +
         " --lora-dropout 0.1 --dtype f32 --quiet";
}

TEST(TrainEval, EvalLossMatchesAPerDocumentReferenceFromTheSavedAdapter) {
  const std::string eval = write_eval_file(), out = fresh_dir("eval_run");
  RunResult r = run_loom(eval_args(out, eval));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(out + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(lines[i].contains("eval_loss"), (i + 1) % 2 == 0) << "step " << i + 1;
  const double got = lines[3].at("eval_loss").get<double>();

  auto model = CausalLM::load(base_model(), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(load_adapter(**model, out).ok());
  auto tokenizer = Tokenizer::load(base_model());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  DataStats stats;
  auto docs = load_jsonl(eval, *tokenizer, DataOptions{}, &stats);
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->size(), 3u);
  ag::NoGradGuard no_grad;
  double sum = 0;
  int64_t count = 0;
  for (const Example& d : *docs) {
    const int64_t n = static_cast<int64_t>(d.ids.size());
    ASSERT_LT(n, 128);
    const std::vector<float> logits = (*model)->forward(Tensor::from_ints(d.ids, {1, n})).value().to_floats();
    const int64_t vocab = static_cast<int64_t>(logits.size()) / n;
    for (int64_t t = 1; t < n; ++t) {  // the token at t predicted from those before it
      if (!d.target[t]) continue;
      const float* row = logits.data() + (t - 1) * vocab;
      double mx = row[0], z = 0;
      for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
      sum += mx + std::log(z) - row[d.ids[t]];
      ++count;
    }
  }
  ASSERT_GT(count, 0);
  ASSERT_LT(count, stats.tokens) << "the prompt's tokens should take no loss";
  // f32 forwards through different kernels (packed rows with segment masks and the fused loss,
  // against one document at a time and full logits): a few ulp of the loss.
  EXPECT_NEAR(got, sum / count, 1e-5 * sum / count);
}

TEST(TrainEval, BadEvalFlagsAreClearErrors) {
  const std::string eval = write_eval_file(), out = fresh_dir("eval_bad");
  const std::string base = "train --model " + base_model() + " --data " + kData + " --out " + out +
                           " --seq-len 64 --max-steps 2 --dtype f32 --quiet";
  RunResult r = run_loom(base + " --eval-every 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--eval-every needs --eval-data"), std::string::npos) << r.output;
  r = run_loom(base + " --eval-data " + eval + " --eval-every -1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--eval-every must be between 0 and"), std::string::npos) << r.output;
  r = run_loom(base + " --eval-data " + out + "/no-such.jsonl");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no-such.jsonl"), std::string::npos) << r.output;
  const std::string broken = fresh_dir("eval_broken") + ".jsonl";
  std::ofstream(broken) << R"({"text": "fine"})" << "\n" << "{not json\n";
  r = run_loom(base + " --eval-data " + broken);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(broken + ":2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
