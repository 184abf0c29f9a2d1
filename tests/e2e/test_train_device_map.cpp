// `loom train --device-map / --max-memory` as a new user meets them on a machine without a GPU:
// the plan is printed and everything is on the CPU (nothing to stream), the losses are those of a
// run without a map, a run resumes under another map (checkpoints do not depend on it), and bad
// maps, caps and combinations are refused naming what and where. `loom generate` takes the flags
// too. The streaming itself is checked in tests/models/test_layer_streamer*.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {

const std::string kData = kSrc + "/examples/demo/weaving.jsonl";

std::string args(const std::string& out, int steps) {
  return "train --model " + base_model() + " --data " + kData + " --out " + out + " --seq-len 64 --batch-size 2" +
         " --max-steps " + std::to_string(steps) + " --lr 5e-3 --lora-r 4 --dtype f32";
}

bool has(const RunResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

TEST(TrainDeviceMap, AMapOnTheCpuTrainsAsWithoutOneAndResumesUnderAnother) {
  const std::string whole = fresh_dir("dm_whole"), out = fresh_dir("dm_map");
  ASSERT_EQ(run_loom(args(whole, 5) + " --quiet").exit_code, 0);
  RunResult r = run_loom(args(out, 5) + " --device-map auto --max-memory cpu=64GiB --stop-after 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "device map (sequential):")) << r.output;
  EXPECT_TRUE(has(r, "cpu: embedding, layers 0-")) << r.output;
  EXPECT_FALSE(has(r, "streamed")) << r.output;  // the CPU computes: nothing to stream
  // The rest under an accelerate device_map file, then the losses are the unmapped run's.
  const std::string map = out + "/../dm_map.json";
  std::ofstream(map) << R"({"model": "cpu", "lm_head": "cpu"})";
  r = run_loom("train --resume " + out + " --device-map " + map + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metric_losses(out), metric_losses(whole));
}

TEST(TrainDeviceMap, BadMapsCapsAndCombinationsAreRefused) {
  const std::string out = fresh_dir("dm_bad");
  const std::string map = out + "/../dm_bad.json";
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--max-memory cpu=8GiB", "--max-memory caps the devices of a --device-map"},
           {"--device-map auto --max-memory cpu=12parsecs", "unknown unit"},
           {"--device-map auto --max-memory cuda:3=1GiB", "GPU(s) are visible"},
           {"--device-map auto --full", "--full"},
           {"--device-map " + map, "names no part of the model"},
           {"--device-map /nonexistent/map.json", "/nonexistent/map.json"}}) {
    std::ofstream(map) << R"({"": "cpu", "model.layer.1": "cpu"})";
    RunResult r = run_loom(args(out, 2) + " " + flags + " --overwrite --quiet");
    EXPECT_NE(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_TRUE(has(r, says)) << flags << "\n" << r.output;
  }
}

}  // namespace
}  // namespace loom::test
