// GGUF reader tests: a file written by gguf.GGUFWriter read end to end (every value type, nested
// string arrays, tensor infos, dequantised tensors against gguf-py's values), versions 2 and 3, and
// one test per corrupt-file case (truncation, bad magic, offsets past the end, absurd counts, bad
// alignment, unknown types) plus a mutation fuzz loop that must never crash.
#include "engine/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "engine/tensor_io.h"

namespace loom {
namespace {

using Bytes = std::vector<uint8_t>;
const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/";

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::StatusOr<GgufFile> parse(const Bytes& b) {
  return GgufFile::from_bytes(std::make_shared<const Bytes>(b), "mem.gguf");
}

// Little-endian GGUF assembled field by field (independent of the reader).
struct Builder {
  Bytes b;
  Builder& u32(uint32_t v) { return raw(&v, 4); }
  Builder& u64(uint64_t v) { return raw(&v, 8); }
  Builder& str(const std::string& s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  Builder& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Builder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    raw("GGUF", 4);
    u32(version);
    u64(n_tensors);
    return u64(n_kv);
  }
  Builder& pad(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
};

// One F32 tensor "w" of 8 elements at data offset `offset` (+ its data when `with_data`).
Bytes one_tensor(uint64_t offset = 0, bool with_data = true, uint32_t type = 0, uint64_t ne0 = 8) {
  Builder g;
  g.header(1, 1).str("general.architecture").u32(8).str("llama");
  g.str("w").u32(1).u64(ne0).u32(type).u64(offset).pad(32);
  if (with_data)
    for (int i = 0; i < 8; ++i) {
      float f = static_cast<float>(i);
      g.raw(&f, 4);
    }
  return g.b;
}

void expect_error(const absl::StatusOr<GgufFile>& f, absl::StatusCode code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), code) << f.status();
  for (const auto& p : parts) EXPECT_NE(f.status().message().find(p), std::string::npos) << "'" << p << "' not in: " << f.status();
}

// ---- a real file from gguf.GGUFWriter -----------------------------------------------------------

TEST(Gguf, ReadsEveryValueType) {
  auto f = GgufFile::open(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), kGgufDefaultAlignment);
  EXPECT_EQ(*f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->find("loom.test.u8")->value.type, GgufType::kUint8);
  EXPECT_EQ(*f->get_int("loom.test.u8"), 200);
  EXPECT_EQ(*f->get_int("loom.test.i8"), -100);
  EXPECT_EQ(*f->get_int("loom.test.u16"), 60000);
  EXPECT_EQ(*f->get_int("loom.test.i16"), -30000);
  EXPECT_EQ(*f->get_int("loom.test.u32"), 4000000000LL);
  EXPECT_EQ(*f->get_int("loom.test.i32"), -2000000000LL);
  EXPECT_EQ(*f->get_float("loom.test.f32"), 0.25);
  EXPECT_EQ(*f->get_bool("loom.test.bool"), true);
  EXPECT_EQ(*f->get_string("loom.test.str"), "h\xc3\xa9llo \xe2\x9c\x93");
  EXPECT_EQ(f->find("loom.test.u64")->value.u, (1ull << 63) + 5);
  EXPECT_FALSE(f->get_int("loom.test.u64").ok());  // does not fit int64: an error, not a wrap
  EXPECT_EQ(*f->get_int("loom.test.i64"), -(1LL << 62));
  EXPECT_EQ(*f->get_float("loom.test.f64"), -1.5e300);
  const GgufValue& nested = f->find("loom.test.nested")->value;
  ASSERT_EQ(nested.type, GgufType::kArray);
  ASSERT_EQ(nested.elem_type, GgufType::kArray);
  ASSERT_EQ(nested.items.size(), 3u);
  EXPECT_EQ(nested.items[0].items[1].str, "bc");
  EXPECT_EQ(nested.items[1].items[0].str, "def");
  EXPECT_EQ(nested.items[2].items[0].str, "");
  EXPECT_EQ(nested.items[2].items.size(), 3u);
  EXPECT_EQ(*f->get_floats("loom.test.f32s"), (std::vector<double>{1.0, -2.0, 0.5}));
  auto tokens = f->get_strings("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ(f->get_ints("tokenizer.ggml.token_type")->size(), tokens->size());
  // Wrong-type access names the key, its offset and both types.
  auto bad = f->get_string("llama.block_count");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'llama.block_count' at offset"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("uint32, expected a string"), std::string::npos) << bad.status();
  EXPECT_EQ(f->get_int("no.such.key").status().code(), absl::StatusCode::kNotFound);
}

TEST(Gguf, TensorInfosAndDequantisedData) {
  auto f = GgufFile::open(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  auto expected = SafetensorsFile::open(kDir + "tiny_llama.expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(f->tensors().size(), 1u + 3 * 9 + 1);
  const GgufTensorInfo* v = f->find_tensor("blk.0.attn_v.weight");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, GgmlType::Q4_1);
  EXPECT_EQ(v->ne, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(v->shape(), (Shape{16, 32}));
  EXPECT_EQ(v->nbytes, 16u * 20);
  EXPECT_EQ(v->offset % 32, 0u);
  // Tensors stored without llama.cpp's q/k permutation equal their Hugging Face counterparts.
  const std::pair<const char*, const char*> pairs[] = {
      {"blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight"},      // Q4_1
      {"blk.1.attn_v.weight", "model.layers.1.self_attn.v_proj.weight"},      // BF16
      {"blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"}, // F16
      {"blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"},       // Q4_K
      {"blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"},       // Q5_K
      {"blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"},       // Q6_K
      {"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"},           // F32
      {"token_embd.weight", "model.embed_tokens.weight"},                     // Q8_0
      {"blk.1.attn_output.weight", "model.layers.1.self_attn.o_proj.weight"}, // Q4_0
  };
  for (const auto& [g, hf] : pairs) {
    SCOPED_TRACE(g);
    auto t = f->read_f32(*f->find_tensor(g));
    ASSERT_TRUE(t.ok()) << t.status();
    const Tensor head = read_tensor(*expected, *expected->find(std::string(hf) + ":head"));
    const Tensor rowsum = read_tensor(*expected, *expected->find(std::string(hf) + ":rowsum"));
    const int64_t cols = t->size(1);
    const float* p = t->data<float>();
    for (int64_t i = 0; i < head.numel(); ++i) ASSERT_EQ(p[i], head.data<float>()[i]) << "element " << i;
    for (int64_t r = 0; r < t->size(0); ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += p[r * cols + c];
      ASSERT_NEAR(s, rowsum.data<double>()[r], 1e-9 * (1 + std::abs(s))) << "row " << r;
    }
  }
}

TEST(Gguf, VersionTwoReadsTheSameAndVersionOneIsRefused) {
  Bytes b = read_all(kDir + "tiny_llama.gguf");
  b[4] = 2;
  auto f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->tensors().size(), 29u);
  b[4] = 1;
  expect_error(parse(b), absl::StatusCode::kUnimplemented, {"mem.gguf", "version 1"});
  b[4] = 7;
  expect_error(parse(b), absl::StatusCode::kInvalidArgument, {"version 7", "offset 4"});
  b[4] = 0;
  b[7] = 3;  // 0x03000000: a big-endian file's version 3
  expect_error(parse(b), absl::StatusCode::kUnimplemented, {"big-endian"});
}

TEST(Gguf, AlignmentKeyMovesTheData) {
  Builder g;
  g.header(1, 1).str("general.alignment").u32(4).u32(64);
  g.str("w").u32(2).u64(4).u64(2).u32(0).u64(0).pad(64);
  const size_t data_at = g.b.size();
  for (int i = 0; i < 8; ++i) {
    float x = 0.5f * static_cast<float>(i);
    g.raw(&x, 4);
  }
  auto f = parse(g.b);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset(), data_at);
  auto t = f->read_f32(f->tensors()[0]);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape(), (Shape{2, 4}));
  EXPECT_EQ(t->data<float>()[7], 3.5f);
}

TEST(Gguf, AlignmentOneAllowsOddTensorAddresses) {
  Builder g;  // one Q8_0 block at an odd file offset (alignment 1, as ggml permits)
  g.header(1, 1).str("general.alignment").u32(4).u32(1);
  g.str("ww").u32(1).u64(32).u32(8).u64(0);
  const size_t data_at = g.b.size();
  ASSERT_EQ(data_at % 2, 1u);
  const uint16_t d = 0x3C00;  // 1.0
  g.raw(&d, 2);
  for (int j = 0; j < 32; ++j) g.b.push_back(static_cast<uint8_t>(j - 16));
  auto f = parse(g.b);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->data_offset(), data_at);
  auto t = f->read_f32(f->tensors()[0]);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int j = 0; j < 32; ++j) EXPECT_EQ(t->data<float>()[j], static_cast<float>(j - 16)) << j;
}

// ---- corrupt files --------------------------------------------------------------------------------

TEST(GgufCorrupt, BadMagicAndEmptyFile) {
  Bytes b = one_tensor();
  b[0] = 'X';
  expect_error(parse(b), absl::StatusCode::kInvalidArgument, {"mem.gguf", "not a GGUF file", "'XGUF'"});
  expect_error(parse(Bytes{}), absl::StatusCode::kDataLoss, {"truncated", "magic"});
}

TEST(GgufCorrupt, EveryTruncationIsAnErrorNotACrash) {
  const Bytes full = read_all(kDir + "tiny_qwen2.gguf");
  for (size_t n = 0; n < full.size(); n += (n < 4096 ? 1 : 97)) {
    auto f = parse(Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
    ASSERT_FALSE(f.ok()) << "a file cut to " << n << " bytes parsed";
    EXPECT_NE(f.status().message().find("mem.gguf"), std::string::npos) << f.status();
  }
  EXPECT_TRUE(parse(full).ok());
}

TEST(GgufCorrupt, TruncatedHeader) {
  Builder g;
  g.raw("GGUF", 4).u32(3).u32(0);
  expect_error(parse(g.b), absl::StatusCode::kDataLoss, {"tensor count", "offset 8"});
}

TEST(GgufCorrupt, AbsurdCountsAreRefusedBeforeAllocating) {
  {
    Builder g;
    g.header(1ull << 60, 0);
    expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"1152921504606846976 tensors"});
  }
  {
    Builder g;
    g.header(0, 1ull << 60);
    expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"1152921504606846976 metadata pairs"});
  }
  {
    Builder g;  // an array of 2^60 strings
    g.header(0, 1).str("tokenizer.ggml.tokens").u32(9).u32(8).u64(1ull << 60);
    expect_error(parse(g.b), absl::StatusCode::kInvalidArgument,
                 {"'tokenizer.ggml.tokens'", "offset 57", "1152921504606846976 string elements"});
  }
  {
    Builder g;  // a string claiming 2^60 bytes
    g.header(0, 1).str("k").u32(8).u64(1ull << 60);
    expect_error(parse(g.b), absl::StatusCode::kDataLoss, {"metadata 'k'", "1152921504606846976 bytes"});
  }
  {
    Builder g;  // a key length past the end
    g.header(0, 1).u64(1000).raw("abcdefghijklmnopqrstuvwxyz", 26);
    expect_error(parse(g.b), absl::StatusCode::kDataLoss, {"metadata key #0", "offset 24", "claims 1000 bytes"});
  }
  {
    Builder g;  // a tensor whose element count overflows
    g.header(1, 0).str("w").u32(4).u64(1ull << 20).u64(1ull << 20).u64(1ull << 20).u64(1ull << 20).u32(0).u64(0);
    expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"tensor 'w'", "overflows"});
  }
}

TEST(GgufCorrupt, TensorSizesTheFileCannotHoldAreRefused) {
  // 2^31 x 2^31 f32 elements are 2^64 bytes: a byte count that wraps to 0 must not pass the bounds check.
  for (uint32_t type : {0u, 28u}) {  // F32, F64
    Builder g;
    g.header(1, 0).str("w").u32(2).u64(1ull << 31).u64(1ull << 31).u32(type).u64(0).pad(32);
    expect_error(parse(g.b), absl::StatusCode::kDataLoss, {"mem.gguf", "tensor 'w'", "bytes"});
  }
  Builder q;  // Q8_0 blocks whose total size overflows
  q.header(1, 0).str("w").u32(2).u64(1ull << 35).u64(1ull << 27).u32(8).u64(0).pad(32);
  expect_error(parse(q.b), absl::StatusCode::kDataLoss, {"tensor 'w'", "Q8_0"});
}

TEST(GgufCorrupt, MetadataElementsBeyondTheBudgetAreRefused) {
  // 2^23 + 1 one-byte elements fit the file but would decode to ~0.8 GB of values: refused by count.
  Builder g;
  g.header(0, 1).str("big").u32(9).u32(0).u64(kGgufMaxMetadataItems + 1);
  g.b.resize(g.b.size() + kGgufMaxMetadataItems + 1);
  expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"metadata 'big'", "8388609", "at most"});
}

TEST(GgufCorrupt, ArraysNestedTooDeep) {
  Builder g;
  g.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < 20; ++i) g.u32(9).u64(1);
  expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"metadata 'deep'", "nests arrays"});
}

TEST(GgufCorrupt, DataOffsetsPastTheEnd) {
  expect_error(parse(one_tensor(0, false)), absl::StatusCode::kDataLoss, {"tensor 'w'", "needs bytes [0, 32)"});
  expect_error(parse(one_tensor(64, true)), absl::StatusCode::kDataLoss, {"tensor 'w'", "[64, 96)"});
  expect_error(parse(one_tensor(~0ull - 31, true)), absl::StatusCode::kDataLoss, {"tensor 'w'"});
  expect_error(parse(one_tensor(4, true)), absl::StatusCode::kInvalidArgument, {"data offset 4", "alignment 32"});
  EXPECT_TRUE(parse(one_tensor(0, true)).ok());
}

TEST(GgufCorrupt, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Builder g;
    g.header(0, 1).str("general.alignment").u32(4).u32(a);
    expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"general.alignment", "power of two"});
  }
  Builder g;
  g.header(0, 1).str("general.alignment").u32(8).str("32");
  expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"general.alignment", "string, expected uint32"});
}

TEST(GgufCorrupt, UnknownTypes) {
  expect_error(parse(one_tensor(0, true, 77)), absl::StatusCode::kInvalidArgument, {"tensor 'w'", "unknown ggml type 77"});
  expect_error(parse(one_tensor(0, true, 8, 8)), absl::StatusCode::kInvalidArgument, {"Q8_0", "32-element blocks"});
  Builder g;
  g.header(0, 1).str("k").u32(13).u32(0);
  expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"metadata 'k'", "unknown value type 13"});
  Builder a;
  a.header(0, 1).str("k").u32(9).u32(99).u64(1);
  expect_error(parse(a.b), absl::StatusCode::kInvalidArgument, {"array of unknown value type 99"});
  Builder bo;
  bo.header(0, 1).str("k").u32(7).raw("\x02", 1);
  expect_error(parse(bo.b), absl::StatusCode::kInvalidArgument, {"bool holding 2"});
}

TEST(GgufCorrupt, DuplicatesAndDimensions) {
  Builder g;
  g.header(0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(2);
  expect_error(parse(g.b), absl::StatusCode::kInvalidArgument, {"'k'", "appears twice"});
  Builder t;
  t.header(2, 0).str("w").u32(1).u64(8).u32(0).u64(0).str("w").u32(1).u64(8).u32(0).u64(32).pad(32);
  for (int i = 0; i < 64; ++i) t.b.push_back(0);
  expect_error(parse(t.b), absl::StatusCode::kInvalidArgument, {"tensor 'w'", "second tensor"});
  Builder d;
  d.header(1, 0).str("w").u32(5).u64(0).u64(0).u64(0);
  expect_error(parse(d.b), absl::StatusCode::kInvalidArgument, {"5 dimensions"});
}

// Tensors sharing bytes (the same offset, or one starting inside another) are refused naming both,
// as the safetensors reader refuses overlapping data_offsets; adjacent ranges are fine.
TEST(GgufCorrupt, OverlappingTensorsAreRefused) {
  auto two = [](uint64_t ne_a, uint64_t off_a, uint64_t off_b) {
    Builder g;
    g.header(2, 0).str("a").u32(1).u64(ne_a).u32(0).u64(off_a).str("b").u32(1).u64(8).u32(0).u64(off_b).pad(32);
    for (int i = 0; i < 128; ++i) g.b.push_back(0);
    return g.b;
  };
  expect_error(parse(two(8, 0, 0)), absl::StatusCode::kInvalidArgument, {"tensor 'b'", "overlaps tensor 'a'"});
  // a holds 16 f32 = bytes [0, 64) of the data; b starts at 32, inside it.
  expect_error(parse(two(16, 0, 32)), absl::StatusCode::kInvalidArgument, {"tensor 'b'", "overlaps tensor 'a'"});
  EXPECT_TRUE(parse(two(16, 0, 64)).ok()) << parse(two(16, 0, 64)).status();  // adjacent: a [0, 64), b [64, 96)
}

TEST(GgufCorrupt, UnsupportedTypeParsesButDoesNotDequantise) {
  Builder g;  // one Q2_K block: a type ggml defines but Loom does not dequantise
  g.header(1, 0).str("w").u32(1).u64(256).u32(10).u64(0).pad(32);
  for (int i = 0; i < 84; ++i) g.b.push_back(0);
  auto f = parse(g.b);
  ASSERT_TRUE(f.ok()) << f.status();
  auto t = f->read_f32(f->tensors()[0]);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("'w' is Q2_K"), std::string::npos) << t.status();
}

TEST(GgufCorrupt, RandomMutationsNeverCrash) {
  const Bytes base = read_all(kDir + "tiny_qwen2.gguf");
  std::mt19937_64 rng(7);
  int failed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    Bytes b = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      // Mostly the header/metadata region, where the structure lives.
      const size_t at = rng() % 2 ? rng() % std::min<size_t>(b.size(), 2048) : rng() % b.size();
      b[at] = static_cast<uint8_t>(rng());
    }
    auto f = parse(b);
    if (!f.ok()) {
      ++failed;
      continue;
    }
    for (const auto& t : f->tensors()) (void)f->read_f32(t);  // must stay inside the buffer
  }
  EXPECT_GT(failed, 0);
}

}  // namespace
}  // namespace loom
