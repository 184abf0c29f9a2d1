// `loom doctor`: every check on its own line and the verdict, the self-test against the CPU
// references, --json for scripts, and a failed check (a folder that cannot be read) giving exit 1.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace loom::test
