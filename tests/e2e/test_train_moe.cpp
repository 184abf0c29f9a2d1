// `loom train` on a mixture-of-experts model (Qwen3-MoE shaped, the demo tokenizer), on the CPU:
// LoRA on attention and on the experts with the load-balancing loss in the loss, aux_loss in
// metrics.jsonl, the adapter in PEFT's target_parameters form, a model drawn with --random-init,
// recompute checkpointing giving the same losses, and a resumed run reproducing the whole one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

// The demo's config made a Qwen3-MoE (4 experts of width 64, top 2, renormalised; layer 3 dense)
// and its tokenizer: no weights (the runs use --random-init).
const std::string& moe_config() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("moe_cfg");
    fs::create_directories(d);
    const std::string demo = kSrc + "/examples/demo/model-config";
    nlohmann::json c = nlohmann::json::parse(std::ifstream(demo + "/config.json"));
    c["model_type"] = "qwen3_moe";
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["num_experts"] = 4;
    c["num_experts_per_tok"] = 2;
    c["moe_intermediate_size"] = 64;
    c["norm_topk_prob"] = true;
    c["mlp_only_layers"] = {3};
    c["router_aux_loss_coef"] = 0.05;
    std::ofstream(d + "/config.json") << c.dump(2);
    fs::copy_file(demo + "/tokenizer.json", d + "/tokenizer.json");
    return d;
  }();
  return dir;
}

std::string args(const std::string& out, int steps) {
  return "train --model " + moe_config() + " --random-init --data " + kSrc + "/examples/demo/weaving.jsonl --out " + out +
         " --seq-len 64 --batch-size 2 --max-steps " + std::to_string(steps) +
         " --lr 5e-3 --lora-r 4 --lora-alpha 8 --lora-targets q_proj,v_proj,experts --dtype f32 --quiet";
}

TEST(TrainMoe, ExpertLoraWithTheLoadBalancingLoss) {
  const std::string out = fresh_dir("moe_train");
  RunResult r = run_loom(args(out, 12));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> loss = metric_losses(out), aux = metric_values(out, "aux_loss");
  ASSERT_EQ(loss.size(), 12u);
  ASSERT_EQ(aux.size(), 12u);
  // transformers' loss is E * sum over k and e of f_ke P_e: top k (2) for perfectly balanced routing,
  // k E (8) at worst.
  for (double a : aux) EXPECT_TRUE(a >= 1.99 && a <= 8.0) << a;
  EXPECT_LT(loss.back(), loss.front());
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(out + "/adapter_config.json"));
  EXPECT_EQ(cfg["target_parameters"], nlohmann::json({"mlp.experts.down_proj", "mlp.experts.gate_up_proj"}));
  EXPECT_EQ(cfg["target_modules"], nlohmann::json({"q_proj", "v_proj"}));

  // The coefficient moves the loss by coef x aux (the config's 0.05 was used above).
  const std::string off = fresh_dir("moe_train_off");
  r = run_loom(args(off, 1) + " --router-aux-loss-coef 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(loss[0] - metric_losses(off)[0], 0.05 * aux[0], 1e-4);

  // Recompute checkpointing: the same losses (the router logits leave each layer as an output).
  const std::string re = fresh_dir("moe_train_re");
  r = run_loom(args(re, 12) + " --checkpointing recompute");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> loss_re = metric_losses(re);
  ASSERT_EQ(loss_re.size(), loss.size());
  for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss_re[i], loss[i], 1e-5) << i;
}

// QLoRA: every expert in NF4, dequantised for each product into the model's kept buffer
// (DequantScratch: forward, the recompute and backward each take it in turn). Each checkpointing mode
// gives the same losses, bit for bit on the CPU, as no checkpointing does.
TEST(TrainMoe, QloraExpertsGiveTheSameLossesInEveryCheckpointingMode) {
  std::vector<double> first;
  for (const char* mode : {"none", "recompute", "offload"}) {
    const std::string out = fresh_dir(std::string("moe_qlora_") + mode);
    const RunResult r = run_loom(args(out, 4) + " --qlora --checkpointing " + mode);
    ASSERT_EQ(r.exit_code, 0) << mode << ": " << r.output;
    const std::vector<double> loss = metric_losses(out);
    ASSERT_EQ(loss.size(), 4u) << mode;
    if (first.empty()) first = loss;
    else EXPECT_EQ(loss, first) << mode;
  }
  EXPECT_LT(first.back(), first.front());
}

TEST(TrainMoe, ResumedRunGivesTheSameLosses) {
  const std::string whole = fresh_dir("moe_whole"), split = fresh_dir("moe_split");
  ASSERT_EQ(run_loom(args(whole, 8)).exit_code, 0);
  RunResult r = run_loom(args(split, 8) + " --stop-after 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_loom(args(split, 8) + " --resume " + split);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metric_losses(split), metric_losses(whole));
  EXPECT_EQ(metric_values(split, "aux_loss"), metric_values(whole, "aux_loss"));
}

}  // namespace
}  // namespace loom::test
