// Model path checks: an empty path, a Hugging Face model id that is not a local folder, and files of
// each kind sniffed from their first bytes (GGUF, safetensors, JSON, JSONL, zip, empty, text, binary).
#include "engine/model_path.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace loom {
namespace {
namespace fs = std::filesystem;

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string p = ::testing::TempDir() + "loom_model_path_" + name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

void expect_has(const absl::Status& s, const std::vector<std::string>& parts) {
  ASSERT_FALSE(s.ok());
  for (const auto& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' not in: " << s;
}

TEST(ModelPath, EmptyPathSaysWhatWasExpected) {
  const absl::Status s = check_input_path("", "model path", "a model folder or a .gguf file");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  expect_has(s, {"the model path is empty (expected a model folder or a .gguf file)"});
}

// owner/name that does not exist locally: Loom reads local folders and GGUF files, here is how to
// get one. A missing path of another shape is simply missing.
TEST(ModelPath, HuggingFaceIdGetsDownloadAdvice) {
  const absl::Status s = check_input_path("HuggingFaceTB/SmolLM2-135M-Instruct", "model path", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  expect_has(s, {"HuggingFaceTB/SmolLM2-135M-Instruct does not exist", "Hugging Face model id",
                 "local model folders and .gguf files only",
                 "huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir DIR", "tools/fetch_smollm2.sh"});
  for (const std::string other : {"/nonexistent/model", "./x/y", "a/b/c", "no_such_model"}) {
    const absl::Status m = check_input_path(other, "model path", "a model folder");
    EXPECT_EQ(m.code(), absl::StatusCode::kNotFound) << other;
    expect_has(m, {"the model path " + other + ": No such file or directory (expected a model folder)"});
    EXPECT_EQ(m.message().find("Hugging Face"), std::string::npos) << m;
  }
  // owner/ exists locally: a local path with a typo, not a hub id.
  const std::string owner = ::testing::TempDir() + "loom_model_path_owner";
  fs::create_directories(owner);
  const std::string cwd = fs::current_path();
  fs::current_path(::testing::TempDir());
  EXPECT_EQ(check_input_path("loom_model_path_owner/model", "model path", "x").message().find("Hugging Face"),
            std::string::npos);
  fs::current_path(cwd);
  EXPECT_TRUE(check_input_path(owner, "model path", "x").ok());
}

TEST(ModelPath, SniffsEachKind) {
  EXPECT_EQ(sniff_path(""), PathKind::kMissing);
  EXPECT_EQ(sniff_path("/nonexistent/file"), PathKind::kMissing);
  EXPECT_EQ(sniff_path(::testing::TempDir()), PathKind::kFolder);
  EXPECT_EQ(sniff_path(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/tiny_llama.gguf"), PathKind::kGguf);
  EXPECT_EQ(sniff_path(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/models/llama/model.safetensors"),
            PathKind::kSafetensors);
  EXPECT_EQ(sniff_path(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/models/llama/config.json"), PathKind::kJson);
  EXPECT_EQ(sniff_path(write_file("one_line.json", R"({"model": {"type": "BPE"}})" "\n")), PathKind::kJson);
  EXPECT_EQ(sniff_path(write_file("pretty.json", "{\n  \"a\": 1,\n  \"b\": 2\n}\n")), PathKind::kJson);
  EXPECT_EQ(sniff_path(write_file("data.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n")), PathKind::kJsonl);
  EXPECT_EQ(sniff_path(write_file("pt.bin", std::string("PK\x03\x04", 4) + "rest")), PathKind::kZip);
  EXPECT_EQ(sniff_path(write_file("empty", "")), PathKind::kEmpty);
  EXPECT_EQ(sniff_path(write_file("notes.txt", "hello\nworld\n")), PathKind::kText);
  EXPECT_EQ(sniff_path(write_file("blob", std::string("\x01\x00\x02\x03", 4))), PathKind::kBinary);
}

TEST(ModelPath, WrongKindSaysWhatItIs) {
  const std::string data = write_file("train.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  const absl::Status s = wrong_kind(data, sniff_path(data), "a model folder or a .gguf file");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  expect_has(s, {data + ": expected a model folder or a .gguf file, but this is a JSONL file"});
}

}  // namespace
}  // namespace loom
