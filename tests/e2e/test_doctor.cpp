// `loom doctor`: every check on its own line and the verdict, the self-test against the CPU
// references, --json for scripts, and a failed check (a folder that cannot be read) giving exit 1.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"

namespace loom::test {
namespace {

TEST(Doctor, ChecksTheMachineAndPassesOnAHealthyOne) {
  RunResult r = run_loom("doctor");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"] build ", "] cpu ", "] openmp ", "] gpu", "] mpi ", "] pinned memory ", "] disk ",
                           "self-test: GEMM", "self-test: attention forward and backward",
                           "self-test: LoRA product forward and backward", "self-test: training step", "All checks passed"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
}

TEST(Doctor, JsonAndAFailedCheck) {
  RunResult r = run_loom("doctor --json --no-self-test");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["verdict"], "All checks passed");
  ASSERT_TRUE(j["checks"].is_array());
  for (const auto& c : j["checks"]) EXPECT_EQ(c["check"].get<std::string>().rfind("self-test", 0), std::string::npos);
  r = run_loom("doctor --no-self-test --out /no/such/folder");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("[FAIL] disk"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 check(s) failed"), std::string::npos) << r.output;
}

// `--model`: a training step's peak in each checkpointing mode, split into its parts; NF4 weights
// take less than bf16 ones, and keeping fewer activations takes less memory.
TEST(Doctor, MemoryEstimateOfAPlannedRun) {
  auto total = [](const std::string& out, const std::string& mode) {
    const size_t at = out.find("\n  " + mode + " ");
    EXPECT_NE(at, std::string::npos) << mode << "\n" << out;
    std::istringstream line(out.substr(at + 3, out.find('\n', at + 1) - at - 3));
    std::string word, unit;
    std::vector<double> gib;
    line >> word;
    for (double v; line >> v >> unit;) gib.push_back(unit == "MiB" ? v / 1024 : v);
    EXPECT_EQ(gib.size(), 5u) << out;  // weights, state, activations, working, total
    return gib;
  };
  // Only config.json is read: the Llama-3.2-1B shape.
  const std::string model = ::testing::TempDir() + "loom_doctor_model_" + std::to_string(getpid());
  std::filesystem::create_directories(model);
  std::ofstream(model + "/config.json") << R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
      "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
      "tie_word_embeddings": true})";
  RunResult dense = run_loom("doctor --model " + model + " --device cpu --seq-len 2048 --batch-size 4");
  ASSERT_EQ(dense.exit_code, 0) << dense.output;
  const auto none = total(dense.output, "none"), recompute = total(dense.output, "recompute"),
             offload = total(dense.output, "offload");
  EXPECT_GT(none[2], recompute[2]);
  EXPECT_GE(recompute[2], offload[2]);
  EXPECT_EQ(none[0], recompute[0]);
  RunResult q = run_loom("doctor --model " + model + " --device cpu --seq-len 2048 --batch-size 4 --qlora");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_LT(total(q.output, "none")[0], none[0]);
  // Full fine-tuning: zero2 over 4 ranks keeps the gradients (4 of 16 bytes a weight) and a quarter
  // of the optimizer's 12; --offload-optimizer keeps the gradients alone; --checkpointing one mode.
  const std::string full = "doctor --model " + model + " --device cpu --seq-len 2048 --batch-size 4 --full";
  RunResult all = run_loom(full);
  RunResult zero = run_loom(full + " --dist zero2 --ranks 4 --checkpointing offload");
  RunResult host = run_loom(full + " --offload-optimizer --checkpointing offload");
  ASSERT_EQ(all.exit_code, 0) << all.output;
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  ASSERT_EQ(host.exit_code, 0) << host.output;
  EXPECT_EQ(zero.output.find("\n  none "), std::string::npos) << zero.output;
  const double state = total(all.output, "offload")[1];
  EXPECT_NEAR(total(zero.output, "offload")[1], state * (4 + 12.0 / 4) / 16, 0.11) << zero.output;
  EXPECT_NEAR(total(host.output, "offload")[1], state * 4 / 16, 0.11) << host.output;
  EXPECT_NE(run_loom(full + " --dist zero3").exit_code, 0);
  // --device-map: the plan loom train would print (on this machine's devices), or its refusal.
  RunResult plan = run_loom("doctor --model " + model + " --seq-len 2048 --batch-size 4 --device-map sequential");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("device map (sequential):"), std::string::npos) << plan.output;
  RunResult tight = run_loom("doctor --model " + model + " --device cpu --device-map auto --max-memory cpu=1GiB");
  EXPECT_NE(tight.exit_code, 0) << tight.output;
  EXPECT_NE(tight.output.find("does not fit"), std::string::npos) << tight.output;
  RunResult bad = run_loom("doctor --model /no/such/model");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("/no/such/model"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace loom::test
