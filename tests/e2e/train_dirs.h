// Shared pieces of the `loom train` e2e tests: a small initialised model made once per test
// process, fresh output folders, and the losses a run wrote to metrics.jsonl.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"

namespace loom::test {

inline const std::string kSrc = LOOM_SOURCE_DIR;

// The demo config and tokenizer, initialised with seed 3. Per process: CTest runs the tests of a
// file in parallel processes.
inline const std::string& base_model() {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "loom_e2e_base_" + std::to_string(getpid());
    std::filesystem::remove_all(d);
    RunResult r = run_loom("init --from " + kSrc + "/examples/demo/model-config --out " + d + " --seed 3");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

// An empty path under the test temp folder, unique to this process.
inline std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "loom_e2e_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  return d;
}

// Every value of `key` in a run's metrics.jsonl, in step order (lines without it are passed over).
inline std::vector<double> metric_values(const std::string& out, const std::string& key) {
  std::vector<double> values;
  std::ifstream f(out + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) values.push_back(j[key].get<double>());
  }
  return values;
}

inline std::vector<double> metric_losses(const std::string& out) { return metric_values(out, "loss"); }

}  // namespace loom::test
