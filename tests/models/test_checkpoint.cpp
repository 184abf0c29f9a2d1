// Checkpoint tests: model folders written with write_safetensors into a temp dir (single file,
// sharded with an index, each malformed case), exact BF16/F16 -> f32 conversion checked against
// bit patterns built in the test, shape-mismatch messages, and unused-tensor reports.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "engine/device.h"
#include "models/checkpoint.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using test::TempDir;

using Bytes = std::vector<uint8_t>;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Values exactly representable in bf16 and f16 (k / 64, |k| <= 256, never all zero): the
// conversions under test must then be exact.
std::vector<float> exact_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    int k = static_cast<int>(rng() % 513) - 256;
    x = static_cast<float>(k == 0 ? 1 : k) / 64.0f;
  }
  return v;
}

Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
// bf16 = the high 16 bits of the f32 pattern (exact for these values: the low bits are zero).
Bytes bf16_bytes(const std::vector<float>& v) {
  Bytes b;
  for (float x : v) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    EXPECT_EQ(u & 0xffffu, 0u) << x << " is not exact in bf16";
    b.push_back(static_cast<uint8_t>(u >> 16));
    b.push_back(static_cast<uint8_t>(u >> 24));
  }
  return b;
}
// IEEE half for normal numbers, built from frexp (independent of Loom's converter).
uint16_t half_bits(float x) {
  if (x == 0) return 0;
  int e;
  const float m = std::frexp(std::fabs(x), &e);  // |x| = m * 2^e, m in [0.5, 1)
  const uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
  const uint32_t mant = static_cast<uint32_t>((m * 2 - 1) * 1024);
  EXPECT_TRUE(exp > 0 && exp < 31 && (m * 2 - 1) * 1024 == static_cast<float>(mant)) << x;
  return static_cast<uint16_t>((x < 0 ? 0x8000u : 0u) | (exp << 10) | mant);
}
Bytes f16_bytes(const std::vector<uint16_t>& h) {
  Bytes b;
  for (uint16_t x : h) {
    b.push_back(static_cast<uint8_t>(x));
    b.push_back(static_cast<uint8_t>(x >> 8));
  }
  return b;
}

struct Spec {
  std::string name;
  DType dtype;
  Shape shape;
  Bytes data;
};

void write_file(const std::string& path, const std::vector<Spec>& specs) {
  std::vector<TensorToWrite> ts;
  for (const Spec& s : specs) ts.push_back({s.name, s.dtype, s.shape, s.data});
  ASSERT_TRUE(write_safetensors(path, ts).ok());
}

std::string index_json(const std::map<std::string, std::string>& weight_map) {
  nlohmann::json j;
  j["metadata"] = {{"total_size", 1234}};
  j["weight_map"] = weight_map;
  return j.dump(2);
}

// A message check: code plus every part present.
void expect_status(const absl::Status& st, absl::StatusCode code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st;
  const std::string msg(st.message());
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// A small Llama-like folder: embed bf16 [5, 3], norm f16 [7] (with a subnormal), lm_head f32 [3, 5],
// a packed u8 [4, 2].
struct Fixture {
  std::vector<float> embed = exact_values(15, 1), lm_head = exact_values(15, 2), norm = exact_values(7, 3);
  std::vector<uint16_t> norm_half;
  Bytes packed = {1, 2, 3, 250, 5, 6, 7, 8};
  Fixture() {
    for (float x : norm) norm_half.push_back(half_bits(x));
    norm[6] = std::ldexp(1.0f, -20);  // f16 subnormal: 16 * 2^-24
    norm_half[6] = 0x0010;
  }
  std::vector<Spec> specs() const {
    return {{"model.embed_tokens.weight", DType::bf16, {5, 3}, bf16_bytes(embed)},
            {"model.norm.weight", DType::f16, {7}, f16_bytes(norm_half)},
            {"lm_head.weight", DType::f32, {3, 5}, f32_bytes(lm_head)},
            {"model.layers.0.mlp.down_proj.weight", DType::u8, {4, 2}, packed}};
  }
};

void expect_fixture_loads(const Checkpoint& ck, const Fixture& fx) {
  auto e = ck.load("model.embed_tokens.weight", DType::f32, Device::cpu(), {5, 3});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->dtype(), DType::f32);
  EXPECT_EQ(e->shape(), (Shape{5, 3}));
  EXPECT_EQ(e->to_floats(), fx.embed);  // bf16 -> f32 is exact

  auto n = ck.load("model.norm.weight", DType::f32, Device::cpu());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->to_floats(), fx.norm);  // f16 -> f32 is exact, subnormal included

  auto l = ck.load("lm_head.weight", DType::bf16, Device::cpu(), {3, 5});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->dtype(), DType::bf16);
  EXPECT_EQ(l->to_floats(), fx.lm_head);  // exact in bf16 by construction

  auto p = ck.load("model.layers.0.mlp.down_proj.weight", DType::bf16, Device::cpu());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dtype(), DType::u8);  // integer tensors keep their dtype
  ASSERT_EQ(p->numel(), 8);
  EXPECT_EQ(Bytes(p->data<uint8_t>(), p->data<uint8_t>() + 8), fx.packed);
}

TEST(HfCheckpoint, SingleFile) {
  TempDir dir;
  Fixture fx;
  write_file(dir.file("model.safetensors"), fx.specs());
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->num_files(), 1u);
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight",
                                                   "model.layers.0.mlp.down_proj.weight", "model.norm.weight"}));
  const TensorInfo* info = ck->find("model.norm.weight");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->dtype, DType::f16);
  EXPECT_EQ(info->shape, (Shape{7}));
  EXPECT_EQ(ck->find("model.missing"), nullptr);
  EXPECT_EQ(ck->file_of("lm_head.weight"), dir.file("model.safetensors"));
  expect_fixture_loads(*ck, fx);
}

TEST(HfCheckpoint, LoadedCpuTensorsAreOwnedAndOutliveTheCheckpoint) {
  TempDir dir;
  Fixture fx;
  write_file(dir.file("model.safetensors"), fx.specs());
  Tensor t;
  {
    auto ck = Checkpoint::open(dir.path());
    ASSERT_TRUE(ck.ok()) << ck.status();
    auto l = ck->load("lm_head.weight", DType::f32, Device::cpu());  // same dtype as stored
    ASSERT_TRUE(l.ok()) << l.status();
    t = *l;
    t.data<float>()[0] = 1234.0f;  // writable: not the read-only mapping
    auto again = ck->load("lm_head.weight", DType::f32, Device::cpu());
    EXPECT_EQ(again->to_floats(), fx.lm_head);
  }
  std::filesystem::remove_all(dir.path());
  std::vector<float> expected = fx.lm_head;
  expected[0] = 1234.0f;
  EXPECT_EQ(t.to_floats(), expected);
}

TEST(HfCheckpoint, ShardedWithIndex) {
  TempDir dir;
  Fixture fx;
  auto specs = fx.specs();
  write_file(dir.file("model-00001-of-00002.safetensors"), {specs[0], specs[1]});
  write_file(dir.file("model-00002-of-00002.safetensors"), {specs[2], specs[3]});
  write_text(dir.file("model.safetensors.index.json"),
             index_json({{specs[0].name, "model-00001-of-00002.safetensors"},
                         {specs[1].name, "model-00001-of-00002.safetensors"},
                         {specs[2].name, "model-00002-of-00002.safetensors"},
                         {specs[3].name, "model-00002-of-00002.safetensors"}}));
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->num_files(), 2u);
  EXPECT_EQ(ck->names().size(), 4u);
  EXPECT_EQ(ck->file_of("lm_head.weight"), dir.file("model-00002-of-00002.safetensors"));
  expect_fixture_loads(*ck, fx);

  // check_unexpected: every tensor consumed -> ok; two missing -> both named.
  const std::vector<std::string> names = ck->names();
  std::set<std::string> all(names.begin(), names.end());
  EXPECT_TRUE(ck->check_unexpected(all).ok());
  all.erase("lm_head.weight");
  all.erase("model.norm.weight");
  expect_status(ck->check_unexpected(all), absl::StatusCode::kInvalidArgument,
                {dir.path(), "2 of the checkpoint's 4", "lm_head.weight", "model.norm.weight"});
}

TEST(HfCheckpoint, MisalignedTensorIsCopiedNotMisread) {
  TempDir dir;
  const std::vector<float> v = exact_values(9, 7);
  // A 1-byte tensor first puts the f32 one at an odd offset of the data region.
  write_file(dir.file("model.safetensors"),
             {{"flag", DType::u8, {1}, Bytes{1}}, {"w", DType::f32, {3, 3}, f32_bytes(v)}});
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto w = ck->load("w", DType::f32, Device::cpu(), {3, 3});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->to_floats(), v);
}

TEST(HfCheckpoint, ShapeMismatchNamesTensorFileAndShapes) {
  TempDir dir;
  Fixture fx;
  write_file(dir.file("model.safetensors"), fx.specs());
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status();
  expect_status(ck->load("model.embed_tokens.weight", DType::bf16, Device::cpu(), {3, 5}).status(),
                absl::StatusCode::kInvalidArgument,
                {"model.embed_tokens.weight", dir.file("model.safetensors"), "[5, 3]", "expected [3, 5]"});
  expect_status(ck->load("model.embed_tokens.weight", DType::f32, Device::cpu(), {5, 3, 1}).status(),
                absl::StatusCode::kInvalidArgument, {"[5, 3]", "expected [5, 3, 1]"});
  expect_status(ck->load("model.nope", DType::f32, Device::cpu()).status(), absl::StatusCode::kNotFound,
                {"model.nope", dir.path()});
  expect_status(ck->load("lm_head.weight", DType::f16, Device::cpu()).status(), absl::StatusCode::kInvalidArgument,
                {"lm_head.weight", "f16", "f32 or bf16"});
  expect_status(ck->load("lm_head.weight", DType::i32, Device::cpu()).status(), absl::StatusCode::kInvalidArgument,
                {"lm_head.weight", "i32"});
  auto d = ck->load("lm_head.weight", DType::f64, Device::cpu());  // f64 for CPU gradient checks
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->dtype(), DType::f64);
  EXPECT_EQ(d->to_floats(), fx.lm_head);
}

// ---- malformed folders ----------------------------------------------------------------------------

TEST(HfCheckpointErrors, FolderMissing) {
  const std::string missing = ::testing::TempDir() + "loom_ckpt_does_not_exist";
  expect_status(Checkpoint::open(missing).status(), absl::StatusCode::kNotFound, {missing, "No such file or directory"});
}

TEST(HfCheckpointErrors, NoSafetensorsListsWhatIsThere) {
  TempDir dir;
  write_text(dir.file("pytorch_model.bin"), "not really");
  write_text(dir.file("config.json"), "{}");
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kNotFound,
                {dir.path(), "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"});
}

TEST(HfCheckpointErrors, IndexMalformed) {
  TempDir dir;
  const std::string index = dir.file("model.safetensors.index.json");
  write_text(index, "{\"weight_map\": {\"a\": ");
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument, {index, "not valid JSON"});
  write_text(index, "{\"metadata\": {}}");
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument, {index, "weight_map"});
  write_text(index, "{\"weight_map\": {\"a.weight\": 3}}");
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {index, "'a.weight'", "shard file name"});
  write_text(index, "{\"weight_map\": {}}");
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument, {index, "no tensors"});
  write_text(index, "{\"weight_map\": {\"a.weight\": \"../elsewhere.safetensors\"}}");
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {index, "../elsewhere.safetensors"});
}

TEST(HfCheckpointErrors, ShardListedInIndexMissing) {
  TempDir dir;
  Fixture fx;
  auto specs = fx.specs();
  write_file(dir.file("model-00001-of-00002.safetensors"), {specs[0]});
  write_text(dir.file("model.safetensors.index.json"),
             index_json({{specs[0].name, "model-00001-of-00002.safetensors"},
                         {specs[2].name, "model-00002-of-00002.safetensors"}}));
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kNotFound,
                {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "lm_head.weight"});
}

TEST(HfCheckpointErrors, TensorInIndexButNotInItsShard) {
  TempDir dir;
  Fixture fx;
  auto specs = fx.specs();
  write_file(dir.file("model-00001-of-00001.safetensors"), {specs[0]});
  write_text(dir.file("model.safetensors.index.json"),
             index_json({{specs[0].name, "model-00001-of-00001.safetensors"},
                         {"model.layers.9.self_attn.q_proj.weight", "model-00001-of-00001.safetensors"}}));
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"model.safetensors.index.json", "model.layers.9.self_attn.q_proj.weight",
                 "model-00001-of-00001.safetensors", "no such tensor"});
}

TEST(HfCheckpointErrors, SameTensorInTwoShards) {
  TempDir dir;
  Fixture fx;
  auto specs = fx.specs();
  write_file(dir.file("model-00001-of-00002.safetensors"), {specs[0], specs[2]});
  write_file(dir.file("model-00002-of-00002.safetensors"), {specs[2], specs[3]});
  write_text(dir.file("model.safetensors.index.json"),
             index_json({{specs[0].name, "model-00001-of-00002.safetensors"},
                         {specs[2].name, "model-00002-of-00002.safetensors"},
                         {specs[3].name, "model-00002-of-00002.safetensors"}}));
  expect_status(
      Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
      {"lm_head.weight", "two shards", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"});
}

TEST(HfCheckpointErrors, IndexPointsAtTheWrongShard) {
  TempDir dir;
  Fixture fx;
  auto specs = fx.specs();
  write_file(dir.file("model-00001-of-00002.safetensors"), {specs[0]});
  write_file(dir.file("model-00002-of-00002.safetensors"), {specs[2]});
  write_text(dir.file("model.safetensors.index.json"),
             index_json({{specs[0].name, "model-00002-of-00002.safetensors"},
                         {specs[2].name, "model-00002-of-00002.safetensors"}}));
  // model-00001 is not listed so it is not opened: embed_tokens is then simply absent from shard 2.
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"model.embed_tokens.weight", "model-00002-of-00002.safetensors", "no such tensor"});
  write_text(dir.file("model.safetensors.index.json"),
             index_json({{specs[0].name, "model-00002-of-00002.safetensors"},
                         {specs[2].name, "model-00001-of-00002.safetensors"}}));
  expect_status(Checkpoint::open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"lm_head.weight", "is listed in shard 'model-00001-of-00002.safetensors'",
                 "stored in " + dir.file("model-00002-of-00002.safetensors")});
}

TEST(HfCheckpointErrors, CorruptShardIsReportedWithItsPath) {
  TempDir dir;
  write_text(dir.file("model.safetensors"), "garbage, not a safetensors file at all");
  auto st = Checkpoint::open(dir.path()).status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find(dir.file("model.safetensors")), std::string::npos) << st;
}

// ---- CUDA (skipped without a GPU) ------------------------------------------------------------------

TEST(HfCheckpoint, LoadsOntoCudaWhenAvailable) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  Fixture fx;
  write_file(dir.file("model.safetensors"), fx.specs());
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status();
  const Device gpu = Device::cuda(0);
  struct Case {
    const char* name;
    DType dtype;
    const std::vector<float>* want;  // exact in bf16 and f16 by construction
  };
  for (const Case& c : {Case{"model.embed_tokens.weight", DType::f32, &fx.embed},   // bf16 -> f32 on the device
                        Case{"model.embed_tokens.weight", DType::bf16, &fx.embed},  // straight copy
                        Case{"lm_head.weight", DType::bf16, &fx.lm_head},           // f32 -> bf16 on the device
                        Case{"lm_head.weight", DType::f32, &fx.lm_head},
                        Case{"model.norm.weight", DType::f32, &fx.norm},  // f16: host conversion
                        Case{"model.norm.weight", DType::bf16, &fx.norm}}) {
    auto t = ck->load(c.name, c.dtype, gpu);
    ASSERT_TRUE(t.ok()) << c.name << ": " << t.status();
    EXPECT_TRUE(t->is_cuda());
    EXPECT_EQ(t->dtype(), c.dtype);
    EXPECT_EQ(t->to_floats(), *c.want) << c.name << " as " << name(c.dtype);
  }
  auto p = ck->load("model.layers.0.mlp.down_proj.weight", DType::bf16, gpu);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dtype(), DType::u8);
  Tensor back = p->to(Device::cpu());
  EXPECT_EQ(Bytes(back.data<uint8_t>(), back.data<uint8_t>() + 8), fx.packed);
}

}  // namespace
}  // namespace loom
