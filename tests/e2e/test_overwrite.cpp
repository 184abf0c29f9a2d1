// One rule for every command that writes files: an existing output is refused, with a message
// naming the flag and --overwrite, and left byte for byte as it was; with --overwrite it is replaced
// (a folder's earlier weights removed, so a stale shard or index is never loaded with the new model).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

bool has(const RunResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

struct Writer {
  std::string name;
  std::string command;  // without the output flag
  std::string out_flag;
  bool folder;
};

TEST(Overwrite, EveryWriterRefusesAnExistingOutputUnlessAskedTo) {
  const std::string qwen2 = fixture_dir("qwen2"), gguf = kSrc + "/tests/fixtures/gguf/tiny_llama.gguf";
  const std::vector<Writer> writers = {
      {"export", "export --model " + gguf + " --type f16", "--out", false},
      {"convert", "convert --gguf " + gguf + " --dtype f32", "--out", true},
      {"quantize", "quantize --model " + kSrc + "/tests/fixtures/models/llama", "--out", true},
      {"merge", "merge --model " + qwen2 + " --adapter " + qwen2 + "/adapter", "--out", true},
      {"init", "init --from " + kSrc + "/examples/demo/model-config", "--out", true},
      {"forward", "forward --model " + qwen2 + " --input " + qwen2 + "/inputs.safetensors", "--output", false},
  };
  const std::string dir = fresh_dir("overwrite");
  fs::create_directories(dir);
  for (const Writer& w : writers) {
    SCOPED_TRACE(w.name);
    const std::string out = dir + "/" + w.name + (w.folder ? "" : w.name == "export" ? ".gguf" : ".safetensors");
    const std::string run = w.command + " " + w.out_flag + " " + out;
    RunResult r = run_loom(run);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string file = w.folder ? out + "/model.safetensors" : out;
    const std::string before = bytes_of(file);
    ASSERT_FALSE(before.empty());
    r = run_loom(run);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(has(r, w.out_flag + " " + out + (w.folder ? " already holds a model" : " already exists"))) << r.output;
    EXPECT_TRUE(has(r, "--overwrite")) << r.output;
    EXPECT_EQ(bytes_of(file), before) << "a refused run touched the output";
    r = run_loom(run + " --overwrite");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(fs::exists(file));
    // Nothing is left behind: no staging folder or temporary file beside the output.
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
  // A folder that exists without a model is refused too (an empty one included), and is written
  // into with --overwrite.
  const std::string empty = dir + "/empty";
  fs::create_directories(empty);
  RunResult r = run_loom(writers[4].command + " --out " + empty);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "--out " + empty + " already exists: choose another folder, or pass --overwrite")) << r.output;
  EXPECT_EQ(run_loom(writers[4].command + " --out " + empty + " --overwrite").exit_code, 0);
  EXPECT_TRUE(fs::exists(empty + "/model.safetensors"));
  // A file where a folder is expected, and the reverse.
  r = run_loom(writers[1].command + " --out " + dir + "/export.gguf --overwrite");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "is a file: expected a folder")) << r.output;
  r = run_loom(writers[5].command + " --output " + empty + " --overwrite");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "is a folder: expected a file name")) << r.output;
}

// --overwrite over a sharded model: the new single file replaces the shards and their index, which
// would otherwise be loaded instead of it.
TEST(Overwrite, AnEarlierShardedModelIsRemovedNotMixedIn) {
  const std::string out = fresh_dir("overwrite_sharded");
  fs::create_directories(out);
  std::ofstream(out + "/model.safetensors.index.json") << R"({"weight_map": {}})";
  std::ofstream(out + "/model-00001-of-00002.safetensors") << "stale";
  std::ofstream(out + "/notes.txt") << "mine";
  RunResult r = run_loom("init --from " + kSrc + "/examples/demo/model-config --out " + out + " --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out + "/model-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_EQ(bytes_of(out + "/notes.txt"), "mine");  // files that are not weights stay
  EXPECT_EQ(run_loom("generate --model " + out + " --prompt hi --max-new-tokens 2 --temperature 0").exit_code, 0);
}

}  // namespace
}  // namespace loom::test
