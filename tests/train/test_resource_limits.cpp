// Resource limits and hostile file-system states: a million-merge tokenizer, a 10 GB (sparse) JSONL, a
// sequence longer than the model's context, 0-byte files, folders where files belong, a read-only
// output folder and a full disk (RLIMIT_FSIZE) while a training checkpoint is written: each ends in a
// clear error naming the file, and the last good checkpoint stays intact.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "engine/gguf.h"
#include "engine/safetensors.h"
#include "engine/tensor_io.h"
#include "models/bnb_checkpoint.h"
#include "models/config.h"
#include "nlohmann/json.hpp"
#include "tests/temp_dir.h"
#include "text/tokenizer.h"
#include "train/data.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
const std::string kFixtures = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures";

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

// The status is an error whose message names `what` (a path, usually).
#define EXPECT_ERROR_NAMING(expr, what)                                      \
  do {                                                                       \
    const absl::Status _s = (expr);                                          \
    EXPECT_FALSE(_s.ok()) << #expr;                                          \
    EXPECT_NE(_s.message().find(what), std::string::npos) << _s.message();   \
  } while (0)

TEST(ResourceLimits, TokenizerWithAMillionMerges) {
  // Qwen2's byte-level fixture plus every two-letter token of [a-zA-Z0-9] and enough four-letter tokens
  // (two two-letter halves) to make a million merges; it loads and round-trips in bounded time.
  std::ifstream in(kFixtures + "/tokenizers/qwen2/tokenizer.json");
  nlohmann::json j = nlohmann::json::parse(in);
  auto& vocab = j["model"]["vocab"];
  auto& merges = j["model"]["merges"];
  int64_t next = 0;
  for (auto& [k, v] : vocab.items()) next = std::max<int64_t>(next, v.get<int64_t>() + 1);
  for (const auto& t : j["added_tokens"]) next = std::max<int64_t>(next, t["id"].get<int64_t>() + 1);
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::vector<std::string> pairs;
  for (char a : alphabet)
    for (char b : alphabet) pairs.push_back(std::string{a, b});
  const int64_t kMerges = 1'000'000;
  int64_t added = 0;
  for (const std::string& p : pairs) {
    if (!vocab.contains(p)) vocab[p] = next++;
    merges.push_back(nlohmann::json::array({p.substr(0, 1), p.substr(1)}));
    ++added;
  }
  for (size_t i = 0; i < pairs.size() && added < kMerges; ++i)
    for (size_t k = 0; k < pairs.size() && added < kMerges; ++k) {
      const std::string t = pairs[i] + pairs[k];
      if (!vocab.contains(t)) vocab[t] = next++;
      merges.push_back(nlohmann::json::array({pairs[i], pairs[k]}));
      ++added;
    }
  ASSERT_GE(static_cast<int64_t>(merges.size()), kMerges);
  TempDir dir("loom_limits");
  write(dir.file("tokenizer.json"), j.dump());
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::load(dir.file("tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), next);
  const std::string text = "Hello abcd xyZ9 0000 the quick brown fox";
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  // Loading is linear in the merges: seconds in a release build, well under CTest's limit with ASan.
  std::printf("a million merges loaded in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  // The same merges over tokens the vocab lacks: an error naming the first bad merge.
  j["model"]["merges"] = nlohmann::json::array();
  for (int64_t i = 0; i < kMerges; ++i) j["model"]["merges"].push_back(nlohmann::json::array({"zzq", "qzz"}));
  write(dir.file("tokenizer.json"), j.dump());
  EXPECT_ERROR_NAMING(Tokenizer::load(dir.file("tokenizer.json")).status(), "model.merges[0]");
}

class DataLimits : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Tokenizer::load(kFixtures + "/tokenizers/qwen2/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = new Tokenizer(*std::move(t));
  }
  static void TearDownTestSuite() { delete tok_; }
  static Tokenizer* tok_;
};
Tokenizer* DataLimits::tok_ = nullptr;

// Bytes this process has read through read(2) and its kin so far (/proc/self/io rchar), -1 where
// the kernel does not say.
int64_t bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  for (std::string key; io >> key;) {
    int64_t v = 0;
    io >> v;
    if (key == "rchar:") return v;
  }
  return -1;
}

TEST_F(DataLimits, TenGigabyteJsonlIsRefusedWithoutReadingIt) {
  TempDir dir("loom_limits");
  const std::string path = dir.file("huge.jsonl");
  {
    std::ofstream f(path);
  }
  fs::resize_file(path, uint64_t{10} << 30);  // sparse: 10 GiB of NUL bytes that take no disk
  DataOptions o;
  o.max_file_bytes = int64_t{1} << 30;
  const int64_t read0 = bytes_read_so_far();
  auto r = load_jsonl(path, *tok_, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("10737418240 bytes"), std::string::npos) << r.status();
  // With the default limit (half the physical memory) the file is refused by its size, or, on a machine
  // with 20 GiB or more, by its first line: 64 MiB of NUL bytes is not a JSONL document.
  r = load_jsonl(path, *tok_, DataOptions{}, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
  if (default_max_data_bytes() >= (uint64_t{10} << 30)) {
    EXPECT_NE(r.status().message().find(path + ":1: the line is longer than"), std::string::npos) << r.status();
  }
  // Not read: at most the first line's 64 MiB (and a block past it), not the 10 GiB. (A bound on
  // bytes, not on seconds: a loaded CI machine under the sanitizers took 72 s for the 64 MiB.)
  const int64_t read1 = bytes_read_so_far();
  if (read0 >= 0 && read1 >= 0) {
    EXPECT_LT(read1 - read0, int64_t{256} << 20) << "bytes read";
  }
}

TEST_F(DataLimits, OverlongLineIsSkippedWhenAskedAndTheRestLoads) {
  TempDir dir("loom_limits");
  const std::string path = dir.file("mixed.jsonl");
  {
    std::ofstream f(path, std::ios::binary);
    f << "{\"text\": \"first\"}\n" << std::string((size_t{64} << 20) + 10, 'x') << "\n{\"text\": \"third\"}\n";
  }
  auto r = load_jsonl(path, *tok_, DataOptions{}, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":2: the line is longer than"), std::string::npos) << r.status();
  DataOptions skip;
  skip.skip_bad_lines = true;
  DataStats st;
  r = load_jsonl(path, *tok_, skip, &st);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 2u);
  EXPECT_EQ(st.skipped, 1);
}

TEST(ResourceLimits, SequenceLongerThanTheContextIsRefused) {
  TempDir dir("loom_limits");
  TrainConfig cfg;
  cfg.model_dir = kFixtures + "/models/llama";  // max_position_embeddings 256
  cfg.data_path = dir.file("data.jsonl");
  cfg.out_dir = dir.file("out");
  cfg.seq_len = 257;
  cfg.quiet = true;
  auto t = Trainer::create(cfg);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("--seq-len 257 exceeds the model's max_position_embeddings 256"), std::string::npos)
      << t.status();
}

TEST_F(DataLimits, EmptyFilesAreClearErrors) {
  TempDir dir("loom_limits");
  for (const char* name : {"config.json", "tokenizer.json", "model.safetensors", "data.jsonl", "m.gguf"})
    write(dir.file(name), "");
  EXPECT_ERROR_NAMING(ModelConfig::load(dir.path()).status(), dir.file("config.json"));
  EXPECT_ERROR_NAMING(Tokenizer::load(dir.file("tokenizer.json")).status(), dir.file("tokenizer.json"));
  EXPECT_ERROR_NAMING(SafetensorsFile::open(dir.file("model.safetensors")).status(), dir.file("model.safetensors"));
  EXPECT_ERROR_NAMING(load_jsonl(dir.file("data.jsonl"), *tok_, DataOptions{}, nullptr).status(), dir.file("data.jsonl"));
  EXPECT_ERROR_NAMING(GgufFile::open(dir.file("m.gguf")).status(), dir.file("m.gguf"));
  const std::string ckpt = dir.file("checkpoint-3");
  fs::create_directories(ckpt);
  write(ckpt + "/trainer_state.json", "");
  EXPECT_ERROR_NAMING(read_train_checkpoint(ckpt, {.no_verify = true}).status(), ckpt + "/trainer_state.json");
  write(ckpt + "/trainer_state.json", "{\"step\": 3}");
  write(ckpt + "/optimizer.safetensors", "");
  EXPECT_ERROR_NAMING(read_train_checkpoint(ckpt, {.no_verify = true}).status(), ckpt + "/optimizer.safetensors");
}

TEST_F(DataLimits, FoldersWhereFilesBelongAreClearErrors) {
  TempDir dir("loom_limits");
  for (const char* name : {"config.json", "tokenizer.json", "model.safetensors", "data.jsonl", "m.gguf"})
    fs::create_directories(dir.file(name));
  EXPECT_ERROR_NAMING(ModelConfig::load(dir.path()).status(), dir.file("config.json"));
  EXPECT_ERROR_NAMING(Tokenizer::load(dir.file("tokenizer.json")).status(), dir.file("tokenizer.json"));
  EXPECT_ERROR_NAMING(SafetensorsFile::open(dir.file("model.safetensors")).status(), dir.file("model.safetensors"));
  EXPECT_ERROR_NAMING(load_jsonl(dir.file("data.jsonl"), *tok_, DataOptions{}, nullptr).status(),
                      dir.file("data.jsonl") + ": is a folder");
  EXPECT_ERROR_NAMING(GgufFile::open(dir.file("m.gguf")).status(), dir.file("m.gguf"));
  EXPECT_ERROR_NAMING(read_bnb_quant_config(dir.path()).status(), dir.file("config.json"));
  const std::string ckpt = dir.file("checkpoint-3");
  fs::create_directories(ckpt + "/trainer_state.json");
  EXPECT_ERROR_NAMING(read_train_checkpoint(ckpt, {.no_verify = true}).status(), ckpt + "/trainer_state.json: is a folder");
  EXPECT_ERROR_NAMING(resolve_checkpoint(dir.path()).status(), "holds no checkpoint-<step> folder");
}

// A folder nobody may write in: 0555 for a normal user; root writes anywhere but in /proc.
std::string read_only_folder(const TempDir& dir) {
  if (geteuid() == 0) return "/proc/self/fdinfo";
  fs::create_directories(dir.file("ro"));
  fs::permissions(dir.file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  return dir.file("ro");
}

TrainCheckpoint small_checkpoint(int64_t step, int64_t floats) {
  TrainCheckpoint c;
  c.state = {{"step", step}};
  c.tensors["0.exp_avg"] = Tensor::full({floats}, 0.5f * static_cast<float>(step), DType::f32);
  return c;
}

TEST(ResourceLimits, ReadOnlyOutputFolderIsAClearError) {
  TempDir dir("loom_limits");
  const std::string ro = read_only_folder(dir);
  auto noop = [](const std::string&) { return absl::OkStatus(); };
  EXPECT_ERROR_NAMING(write_train_checkpoint(ro, 1, small_checkpoint(1, 4), noop), ro);
  EXPECT_ERROR_NAMING(save_tensors(ro + "/x.safetensors", {{"a", Tensor::full({4}, 1.f, DType::f32)}}), ro);
  TrainConfig cfg;
  cfg.model_dir = kFixtures + "/models/llama";
  cfg.data_path = dir.file("data.jsonl");
  cfg.out_dir = ro + "/out";
  cfg.quiet = true;
  auto t = Trainer::create(cfg);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("output folder " + cfg.out_dir + " is not writable"), std::string::npos) << t.status();
  if (geteuid() != 0) fs::permissions(dir.file("ro"), fs::perms::owner_all);
}

TEST(ResourceLimits, FullDiskDuringCheckpointingKeepsTheLastGoodOne) {
  TempDir dir("loom_limits");
  const std::string out = dir.file("out");
  fs::create_directories(out);
  auto noop = [](const std::string&) { return absl::OkStatus(); };
  ASSERT_TRUE(write_train_checkpoint(out, 1, small_checkpoint(1, 16), noop).ok());
  // The disk "fills" at 64 KiB a file: the next checkpoint's 1 MiB optimizer state cannot be written.
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing us
  rlimit small = old;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status s = write_train_checkpoint(out, 2, small_checkpoint(2, 1 << 18), noop);
  const absl::Status s_extra = write_train_checkpoint(out, 3, small_checkpoint(3, 16), [](const std::string& d) {
    std::ofstream f(d + "/adapter_model.safetensors", std::ios::binary);
    f << std::string(1 << 20, 'x');
    f.flush();
    return f ? absl::OkStatus() : absl::DataLossError("cannot write " + d + "/adapter_model.safetensors");
  });
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("optimizer.safetensors"), std::string::npos) << s;
  EXPECT_FALSE(s_extra.ok());
  EXPECT_NE(s_extra.message().find("adapter_model.safetensors"), std::string::npos) << s_extra;
  // Nothing half-written is left, and resuming finds step 1 with its state and tensors as saved.
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(out)) entries.push_back(e.path().filename().string());
  EXPECT_EQ(entries, std::vector<std::string>{"checkpoint-1"});
  auto resolved = resolve_checkpoint(out);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, out + "/checkpoint-1");
  auto c = read_train_checkpoint(*resolved);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state["step"], 1);
  ASSERT_EQ(c->tensors.count("0.exp_avg"), 1u);
  EXPECT_EQ(c->tensors.at("0.exp_avg").numel(), 16);
  EXPECT_EQ(c->tensors.at("0.exp_avg").data<float>()[15], 0.5f);
}

}  // namespace
}  // namespace loom
