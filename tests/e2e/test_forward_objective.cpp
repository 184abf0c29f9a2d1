// The contract of `loom forward --objective dpo|ipo|simpo|orpo` (issue 31): pairs in a safetensors
// file, loss / chosen_logps / rejected_logps (/ ref_*) / grad.<PEFT name> out, compared with what TRL's
// loss code gave for the same pairs (tests/fixtures/preference, tools/reference/make_preference_reference.py),
// and bad input named with a non-zero exit.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/e2e/cli.h"
#include "tests/models/fixtures.h"
#include "engine/tensor_io.h"
#include "tests/temp_dir.h"

namespace loom::test {
namespace {

const std::string kPref = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/preference/";

bool has(const RunResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

double rel(const Tensor& a, const Tensor& b) { return rel_err(a, b); }

TEST(ForwardObjective, WritesTrlsLossLogpsAndGradients) {
  TempDir dir;
  struct Case {
    const char* variant;
    const char* name;
    std::string flags;
  };
  for (const Case& c : {Case{"llama", "dpo_smoothed", "--objective dpo --beta 0.5 --label-smoothing 0.2"},
                        Case{"phi3", "ipo", "--objective ipo --beta 0.1"},
                        Case{"phi3", "simpo", "--objective simpo --beta 2 --simpo-gamma 0.5"},
                        Case{"llama", "orpo", "--objective orpo --beta 0.1"}}) {
    SCOPED_TRACE(std::string(c.variant) + "/" + c.name);
    const std::string out = dir.file(std::string(c.variant) + c.name + ".safetensors");
    RunResult r = run_loom("forward --model " + fixture_dir(c.variant) + " --adapter " + fixture_dir(c.variant) +
                           "/adapter --input " + kPref + c.variant + "/inputs.safetensors --output " + out + " --grads " +
                           c.flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(has(r, "rewards/accuracies")) << r.output;
    auto got = read_all(out);
    auto want = read_all(kPref + c.variant + "/" + c.name + ".safetensors");
    ASSERT_EQ(got.size(), want.size());
    for (auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_EQ(got[name].shape(), t.shape()) << name;
      EXPECT_LT(rel(got[name], t), name.starts_with("grad.") ? 1e-4 : 2e-5) << name;
    }
  }
}

// A mixture-of-experts model: aux_loss written (transformers' masked aux_loss of the MoE fixture rows,
// row 1 padded from position 9 by its attention mask), and loss = the DPO loss + the coefficient
// times it.
TEST(ForwardObjective, MoeWritesTheLoadBalancingLossOfTheUnpaddedTokens) {
  TempDir dir;
  auto in = read_all(fixture_dir("qwen3_moe") + "/inputs.safetensors");
  auto ref = read_all(fixture_dir("qwen3_moe") + "/reference.safetensors");
  auto row = [](const Tensor& t, int64_t r) { return t.narrow(0, r, 1).contiguous(); };
  std::vector<int32_t> l1 = row(in["labels"], 1).to_ints();
  for (size_t j = 9; j < l1.size(); ++j) l1[j] = -100;
  const std::string pairs = dir.file("pairs.safetensors");
  ASSERT_TRUE(save_tensors(pairs,
                           {{"chosen_input_ids", row(in["input_ids"], 0)}, {"chosen_labels", row(in["labels"], 0)},
                            {"rejected_input_ids", row(in["input_ids"], 1)},
                            {"rejected_labels", Tensor::from_ints(l1, {1, static_cast<int64_t>(l1.size())})},
                            {"chosen_attention_mask", row(in["attention_mask_padded"], 0)},
                            {"rejected_attention_mask", row(in["attention_mask_padded"], 1)}},
                           DType::i32)
                  .ok());
  double loss[2] = {0, 0};
  for (int with : {0, 1}) {
    const std::string out = dir.file("out" + std::to_string(with) + ".safetensors");
    RunResult r = run_loom("forward --model " + fixture_dir("qwen3_moe") + " --input " + pairs + " --output " + out +
                           " --objective dpo --router-aux-loss-coef " + (with ? "0.5" : "0"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto got = read_all(out);
    ASSERT_TRUE(got.count("aux_loss"));
    EXPECT_NEAR(got["aux_loss"].item(), ref["aux_loss_masked"].item(), 2e-5);
    loss[with] = got["loss"].item();
  }
  EXPECT_NEAR(loss[1] - loss[0], 0.5 * ref["aux_loss_masked"].item(), 2e-5);
  RunResult bad = run_loom("forward --model " + fixture_dir("qwen3_moe") + " --input " + pairs + " --output " +
                           dir.file("o.safetensors") + " --objective dpo --router-aux-loss-coef -1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(has(bad, "--router-aux-loss-coef must be a number >= 0")) << bad.output;
}

TEST(ForwardObjective, BadInputIsNamed) {
  TempDir dir;
  const std::string model = fixture_dir("llama"), in = kPref + "llama/inputs.safetensors";
  RunResult r = run_loom("forward --model " + model + " --input " + in + " --output " + dir.file("o.safetensors") +
                         " --objective kto");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "unknown preference objective 'kto'")) << r.output;
  r = run_loom("forward --model " + model + " --input " + in + " --output " + dir.file("o.safetensors") +
               " --objective dpo --beta abc");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "--beta must be a number")) << r.output;
  // An SFT input file (input_ids/labels) is not a file of pairs.
  r = run_loom("forward --model " + model + " --input " + fixture_dir("llama") + "/inputs.safetensors --output " +
               dir.file("o.safetensors") + " --objective dpo");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "no tensor named chosen_input_ids")) << r.output;
  r = run_loom("forward --model " + model + " --input " + in + " --output " + dir.file("o.safetensors") +
               " --objective dpo --grads");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "--grads needs --adapter")) << r.output;
  // Without an adapter the model is its own reference: every reward is 0 and DPO's loss is log 2.
  r = run_loom("forward --model " + model + " --input " + in + " --output " + dir.file("o.safetensors") +
               " --objective dpo");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(read_all(dir.file("o.safetensors"))["loss"].to_floats()[0], std::log(2.0), 1e-6);
}

}  // namespace
}  // namespace loom::test
