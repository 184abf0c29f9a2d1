// Safetensors reader/writer tests: round trips of every dtype, a file assembled byte by byte from the
// spec, one test per malformed-header case (code + message naming file and tensor), and a fuzz loop.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/mapped_file.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using Bytes = std::vector<uint8_t>;
constexpr const char* kLabel = "mem.safetensors";

// A fresh directory under the test temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "loom_st_XXXXXX";
    const char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_raw(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

Bytes random_bytes(std::mt19937_64& rng, size_t n, bool boolean = false) {
  Bytes b(n);
  for (auto& x : b) x = boolean ? static_cast<uint8_t>(rng() & 1) : static_cast<uint8_t>(1 + rng() % 255);
  return b;
}

// 8-byte little-endian length, the header text verbatim, then `data` (independent of the writer).
Bytes assemble(uint64_t header_len, const std::string& header, const Bytes& data) {
  Bytes b;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(header_len >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}
Bytes assemble(const std::string& header, size_t data_size) {
  std::mt19937_64 rng(data_size);
  return assemble(header.size(), header, random_bytes(rng, data_size));
}

absl::StatusOr<SafetensorsFile> parse(const Bytes& b) {
  return SafetensorsFile::from_bytes(std::make_shared<const Bytes>(b), kLabel);
}

// ---- round trips ------------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDTypeAndShape) {
  TempDir dir;
  std::mt19937_64 rng(1234);
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                          DType::i32, DType::i64, DType::u8,   DType::boolean};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {7}, {3, 5}, {4, 0, 2}, {2, 1, 3, 3}};
  std::vector<Bytes> payloads;
  std::vector<TensorToWrite> tensors;
  payloads.reserve(std::size(dtypes) * shapes.size());
  for (DType dt : dtypes)
    for (size_t s = 0; s < shapes.size(); ++s) {
      int64_t numel = 1;
      for (int64_t d : shapes[s]) numel *= d;
      payloads.push_back(random_bytes(rng, bytes_for(dt, numel), dt == DType::boolean));
      tensors.push_back({std::string(name(dt)) + ".t" + std::to_string(s), dt, shapes[s], payloads.back()});
    }
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"empty", ""}, {"unicode \xC3\xA9\xE2\x9C\x93", "{\"json\": [1, 2]}\n\ttab"}};
  const std::string path = dir.file("all.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors, meta).ok());

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), tensors.size());
  const Bytes raw = read_all(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | raw[i];
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data must start 8-byte aligned";
  for (size_t i = 0; i < header_len; ++i) EXPECT_NE(raw[8 + i], 0) << "header byte " << i;
  uint64_t next = 8 + header_len, total = 0;
  for (const TensorToWrite& t : tensors) {  // laid out in the order given, contiguously
    const TensorInfo* info = f->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->name, t.name);
    EXPECT_EQ(info->dtype, t.dtype) << t.name;
    EXPECT_EQ(info->shape, t.shape) << t.name;
    EXPECT_EQ(info->offset, next) << t.name;
    EXPECT_EQ(info->nbytes, t.data.size()) << t.name;
    auto got = f->bytes(*info);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), t.data.begin(), t.data.end())) << t.name;
    next += info->nbytes;
    total += info->nbytes;
  }
  EXPECT_EQ(raw.size(), 8 + header_len + total);
  for (size_t i = 1; i < f->tensors().size(); ++i)
    EXPECT_LE(f->tensors()[i - 1].offset, f->tensors()[i].offset) << "tensors() must be in file order";
  EXPECT_EQ(f->find("nope"), nullptr);

  // from_bytes over the same bytes sees the same thing.
  auto m = parse(raw);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tensors().size(), tensors.size());
  EXPECT_EQ(m->metadata(), meta);
}

TEST(Safetensors, EmptyFilesAndMetadataOnly) {
  TempDir dir;
  ASSERT_TRUE(write_safetensors(dir.file("none.safetensors"), {}).ok());
  auto f = SafetensorsFile::open(dir.file("none.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_EQ(read_all(dir.file("none.safetensors")).size() % 8, 0u);

  ASSERT_TRUE(write_safetensors(dir.file("meta.safetensors"), {}, {{"a", "b"}}).ok());
  auto g = SafetensorsFile::open(dir.file("meta.safetensors"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->metadata().at("a"), "b");
}

TEST(Safetensors, WriteReplacesExistingFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  write_raw(path, Bytes(100, 7));
  const Bytes data = {1, 2, 3, 4};
  ASSERT_TRUE(write_safetensors(path, {{"x", DType::f32, {1}, data}}).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors().size(), 1u);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
  EXPECT_EQ(entries, 1);
}

// ---- a file made by hand from the spec ----------------------------------------------------------

TEST(Safetensors, ReadsHandAssembledFile) {
  // Keys deliberately not in offset order; metadata in the middle; trailing spaces; header length
  // chosen so the data is NOT 8-byte aligned (the spec does not require it of readers).
  std::string header = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                       R"("__metadata__":{"format":"pt"},)"
                       R"("a":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                       R"("c":{"dtype":"BF16","shape":[1,0],"data_offsets":[16,16]},)"
                       R"("d":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}}   )";
  if ((8 + header.size()) % 8 == 0) header += ' ';
  Bytes file;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file.push_back(static_cast<uint8_t>((n >> (8 * i)) & 0xFF));
  for (char c : header) file.push_back(static_cast<uint8_t>(c));
  // a = int64 -5 little-endian: FB FF FF FF FF FF FF FF
  for (uint8_t x : {0xFB, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}) file.push_back(x);
  // b = {1.5f, -2.0f}: 0x3FC00000, 0xC0000000 little-endian
  for (uint8_t x : {0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x00, 0xC0}) file.push_back(x);
  for (uint8_t x : {1, 0, 1}) file.push_back(x);  // d

  auto check = [](const SafetensorsFile& f, uint64_t data_start) {
    ASSERT_EQ(f.tensors().size(), 4u);
    EXPECT_EQ(f.tensors()[0].name, "a");
    EXPECT_EQ(f.tensors()[1].name, "b");
    EXPECT_EQ(f.tensors()[2].name, "c");  // empty tensor sorts before the one at the same offset
    EXPECT_EQ(f.tensors()[3].name, "d");
    EXPECT_EQ(f.metadata().at("format"), "pt");
    const TensorInfo* a = f.find("a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->dtype, DType::i64);
    EXPECT_TRUE(a->shape.empty());
    EXPECT_EQ(a->offset, data_start);
    int64_t av;
    std::memcpy(&av, f.bytes(*a).data(), 8);
    EXPECT_EQ(av, -5);
    const TensorInfo* b = f.find("b");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->dtype, DType::f32);
    EXPECT_EQ(b->shape, std::vector<int64_t>{2});
    EXPECT_EQ(b->offset, data_start + 8);
    float bv[2];
    std::memcpy(bv, f.bytes(*b).data(), 8);
    EXPECT_EQ(bv[0], 1.5f);
    EXPECT_EQ(bv[1], -2.0f);
    const TensorInfo* c = f.find("c");
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->dtype, DType::bf16);
    EXPECT_EQ(c->shape, (std::vector<int64_t>{1, 0}));
    EXPECT_EQ(c->nbytes, 0u);
    EXPECT_TRUE(f.bytes(*c).empty());
    const TensorInfo* d = f.find("d");
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->dtype, DType::boolean);
    auto dv = f.bytes(*d);
    EXPECT_EQ(Bytes(dv.begin(), dv.end()), (Bytes{1, 0, 1}));
  };
  auto m = parse(file);
  ASSERT_TRUE(m.ok()) << m.status();
  check(*m, 8 + n);

  TempDir dir;
  write_raw(dir.file("hand.safetensors"), file);
  auto f = SafetensorsFile::open(dir.file("hand.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  check(*f, 8 + n);
}

TEST(Safetensors, KeepaliveOutlivesTheFileObject) {
  TempDir dir;
  const Bytes data = {9, 8, 7, 6, 5, 4, 3, 2};
  ASSERT_TRUE(write_safetensors(dir.file("k.safetensors"), {{"x", DType::f64, {}, data}}).ok());
  std::shared_ptr<const void> keep;
  std::span<const uint8_t> view;
  {
    auto f = SafetensorsFile::open(dir.file("k.safetensors"));
    ASSERT_TRUE(f.ok()) << f.status();
    SafetensorsFile moved = std::move(*f);  // moving keeps find()/bytes() working
    view = moved.bytes(*moved.find("x"));
    keep = moved.keepalive();
  }
  std::filesystem::remove(dir.file("k.safetensors"));  // the mapping survives unlink too
  EXPECT_EQ(Bytes(view.begin(), view.end()), data);
}

TEST(MappedFile, EmptyMissingDirectoryAndMove) {
  TempDir dir;
  write_raw(dir.file("empty"), {});
  auto e = MappedFile::open(dir.file("empty"));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->size(), 0u);

  write_raw(dir.file("abc"), {'a', 'b', 'c'});
  auto f = MappedFile::open(dir.file("abc"));
  ASSERT_TRUE(f.ok()) << f.status();
  MappedFile g = std::move(*f);
  EXPECT_EQ(f->size(), 0u);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(std::memcmp(g.data(), "abc", 3), 0);

  auto missing = MappedFile::open(dir.file("missing"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("missing"), std::string::npos);
  auto d = MappedFile::open(dir.path());
  EXPECT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(dir.path()), std::string::npos);
}

// ---- malformed files --------------------------------------------------------------------------

struct BadCase {
  const char* what;
  Bytes bytes;
  absl::StatusCode code;
  std::vector<std::string> mentions;  // substrings the message must contain (besides the label)
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  std::string s = "\"";
  return s.append(name)
      .append("\":{\"dtype\":")
      .append(dtype)
      .append(",\"shape\":")
      .append(shape)
      .append(",\"data_offsets\":")
      .append(offsets)
      .append("}");
}

std::string object(std::initializer_list<std::string> entries) {
  std::string s = "{";
  for (const std::string& e : entries) s.append(s.size() > 1 ? "," : "").append(e);
  return s.append("}");
}

std::vector<BadCase> bad_cases() {
  using C = absl::StatusCode;
  const C inv = C::kInvalidArgument, loss = C::kDataLoss;
  auto one = [](const std::string& e, size_t data) { return assemble(object({e}), data); };
  std::vector<BadCase> v;
  v.push_back({"empty file", {}, loss, {"too short"}});
  v.push_back({"7 bytes", Bytes(7, 1), loss, {"too short"}});
  v.push_back({"absurd header length", assemble(200'000'000, "{}", {}), inv, {"200000000", "limit"}});
  v.push_back({"header past end", assemble(100, "{}", {}), loss, {"header length 100"}});
  v.push_back({"not JSON", assemble("{\"w\":", 0), inv, {"not valid JSON"}});
  v.push_back({"empty header", assemble("", 0), inv, {"not valid JSON"}});
  v.push_back({"invalid UTF-8", assemble("{\"w\xff\":1}", 0), inv, {"not valid JSON"}});
  v.push_back({"deep nesting",
               assemble(std::string(100'000, '[') + std::string(100'000, ']'), 0),
               inv,
               {"deeper than 64"}});
  v.push_back({"header is an array", assemble("[1,2]", 0), inv, {"array", "expected an object"}});
  v.push_back({"entry not object", assemble("{\"w\":5}", 0), inv, {"'w'", "expected an object"}});
  v.push_back(
      {"no dtype", assemble(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), inv, {"'w'", "'dtype'"}});
  v.push_back(
      {"no shape", assemble(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4), inv, {"'w'", "'shape'"}});
  v.push_back(
      {"no offsets", assemble(R"({"w":{"dtype":"F32","shape":[1]}})", 4), inv, {"'w'", "'data_offsets'"}});
  v.push_back({"unknown dtype",
               one(entry("w", "\"F17\"", "[1]", "[0,4]"), 4),
               inv,
               {"'w'", "unknown dtype 'F17'", "BF16"}});
  v.push_back(
      {"unsupported I8", one(entry("w", "\"I8\"", "[1]", "[0,1]"), 1), inv, {"'w'", "I8 is not supported"}});
  v.push_back({"unsupported F8",
               one(entry("w", "\"F8_E4M3\"", "[1]", "[0,1]"), 1),
               inv,
               {"'w'", "F8_E4M3 is not supported"}});
  v.push_back({"dtype not string", one(entry("w", "4", "[1]", "[0,4]"), 4), inv, {"'w'", "dtype"}});
  v.push_back(
      {"negative dim", one(entry("w", "\"F32\"", "[2,-1]", "[0,4]"), 4), inv, {"'w'", "-1", "non-negative"}});
  v.push_back({"fractional dim", one(entry("w", "\"F32\"", "[1.5]", "[0,4]"), 4), inv, {"'w'", "1.5"}});
  v.push_back({"string dim", one(entry("w", "\"F32\"", "[\"1\"]", "[0,4]"), 4), inv, {"'w'", "shape"}});
  v.push_back({"shape not array", one(entry("w", "\"F32\"", "4", "[0,4]"), 4), inv, {"'w'", "shape"}});
  v.push_back({"numel overflow",
               one(entry("w", "\"F32\"", "[4294967296,4294967296,2]", "[0,4]"), 4),
               inv,
               {"'w'", "overflows"}});
  v.push_back({"bytes overflow",
               one(entry("w", "\"F64\"", "[2305843009213693952]", "[0,4]"), 4),
               inv,
               {"'w'", "overflows"}});
  v.push_back({"dim too large",
               one(entry("w", "\"U8\"", "[18446744073709551615]", "[0,4]"), 4),
               inv,
               {"'w'", "non-negative"}});
  v.push_back({"offsets decreasing",
               one(entry("w", "\"F32\"", "[1]", "[4,0]"), 4),
               inv,
               {"'w'", "data_offsets", "begin <= end"}});
  v.push_back({"one offset", one(entry("w", "\"F32\"", "[1]", "[4]"), 4), inv, {"'w'", "data_offsets"}});
  v.push_back(
      {"three offsets", one(entry("w", "\"F32\"", "[1]", "[0,4,4]"), 4), inv, {"'w'", "data_offsets"}});
  v.push_back(
      {"negative offset", one(entry("w", "\"F32\"", "[1]", "[-4,0]"), 4), inv, {"'w'", "data_offsets"}});
  v.push_back(
      {"float offsets", one(entry("w", "\"F32\"", "[1]", "[0.0,4.0]"), 4), inv, {"'w'", "data_offsets"}});
  v.push_back({"string offsets",
               one(entry("w", "\"F32\"", "[1]", "[\"0\",\"4\"]"), 4),
               inv,
               {"'w'", "data_offsets"}});
  v.push_back({"size mismatch",
               one(entry("w", "\"F32\"", "[2,3]", "[0,20]"), 20),
               inv,
               {"'w'", "20 bytes", "expected 24"}});
  v.push_back({"past end of data",
               one(entry("w", "\"F32\"", "[2]", "[0,8]"), 6),
               loss,
               {"'w'", "past the end", "truncated"}});
  v.push_back(
      {"overlap",
       assemble(object({entry("a", "\"F32\"", "[2]", "[0,8]"), entry("b", "\"F32\"", "[2]", "[4,12]")}), 12),
       inv,
       {"'a'", "'b'", "overlaps"}});
  v.push_back(
      {"same offsets twice",
       assemble(object({entry("a", "\"F32\"", "[1]", "[0,4]"), entry("b", "\"I32\"", "[1]", "[0,4]")}), 4),
       inv,
       {"'a'", "'b'", "overlaps"}});
  v.push_back(
      {"hole",
       assemble(object({entry("a", "\"F32\"", "[1]", "[0,4]"), entry("b", "\"F32\"", "[1]", "[8,12]")}), 12),
       inv,
       {"'a'", "'b'", "holes"}});
  v.push_back(
      {"first tensor not at 0", one(entry("w", "\"F32\"", "[1]", "[4,8]"), 8), inv, {"'w'", "holes"}});
  v.push_back(
      {"trailing bytes", one(entry("w", "\"F32\"", "[1]", "[0,4]"), 9), inv, {"'w'", "5 trailing bytes"}});
  v.push_back({"data but no tensors", assemble("{}", 3), inv, {"3 trailing bytes"}});
  v.push_back(
      {"metadata not object", assemble(R"({"__metadata__":[1]})", 0), inv, {"__metadata__", "array"}});
  v.push_back({"metadata value not string",
               assemble(R"({"__metadata__":{"k":1}})", 0),
               inv,
               {"__metadata__", "'k'", "string"}});
  v.push_back(
      {"duplicate tensor",
       assemble(object({entry("w", "\"F32\"", "[1]", "[0,4]"), entry("w", "\"F32\"", "[1]", "[4,8]")}), 8),
       inv,
       {"'w'", "twice"}});
  v.push_back({"duplicate field",
               assemble(R"({"w":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4),
               inv,
               {"'dtype'", "twice"}});
  return v;
}

TEST(Safetensors, MalformedFilesGiveNamedErrors) {
  for (const BadCase& c : bad_cases()) {
    auto f = parse(c.bytes);
    ASSERT_FALSE(f.ok()) << c.what;
    EXPECT_EQ(f.status().code(), c.code) << c.what << ": " << f.status();
    const std::string msg(f.status().message());
    EXPECT_EQ(msg.rfind(kLabel, 0), 0u) << c.what << ": message must start with the file: " << msg;
    for (const std::string& m : c.mentions)
      EXPECT_NE(msg.find(m), std::string::npos) << c.what << ": expected '" << m << "' in: " << msg;
  }
}

TEST(Safetensors, OpenNamesTheFileOnDisk) {
  TempDir dir;
  auto missing = SafetensorsFile::open(dir.file("no.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no.safetensors"), std::string::npos);
  write_raw(dir.file("bad.safetensors"), assemble(object({entry("w", "\"F32\"", "[2]", "[0,8]")}), 4));
  auto bad = SafetensorsFile::open(dir.file("bad.safetensors"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find(dir.file("bad.safetensors")), std::string::npos) << bad.status();
  write_raw(dir.file("empty.safetensors"), {});
  EXPECT_EQ(SafetensorsFile::open(dir.file("empty.safetensors")).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(SafetensorsFile::from_bytes(nullptr, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("out.safetensors");
  const Bytes four(4, 1), eight(8, 1);
  struct W {
    const char* what;
    std::vector<TensorToWrite> tensors;
    std::map<std::string, std::string> meta;
    std::vector<std::string> mentions;
  };
  const std::vector<W> cases = {
      {"duplicate", {{"a", DType::f32, {1}, four}, {"a", DType::f32, {1}, four}}, {}, {"'a'", "duplicate"}},
      {"size mismatch",
       {{"a", DType::f32, {1}, four}, {"b", DType::f32, {3}, eight}},
       {},
       {"'b'", "8 bytes", "F32 [3]"}},
      {"nf4", {{"q", DType::nf4, {8}, four}}, {}, {"'q'", "nf4", "no safetensors name"}},
      {"negative dim", {{"n", DType::u8, {-4}, four}}, {}, {"'n'", "negative"}},
      {"reserved name", {{"__metadata__", DType::u8, {4}, four}}, {}, {"reserved"}},
      {"bad utf-8 name", {{"x\xff", DType::u8, {4}, four}}, {}, {"UTF-8"}},
      {"bad utf-8 metadata", {}, {{"k", "\xc3"}}, {"UTF-8"}},
  };
  for (const W& w : cases) {
    absl::Status st = write_safetensors(path, w.tensors, w.meta);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << w.what << ": " << st;
    const std::string msg(st.message());
    EXPECT_NE(msg.find(path), std::string::npos) << w.what << ": " << msg;
    for (const std::string& m : w.mentions)
      EXPECT_NE(msg.find(m), std::string::npos) << w.what << ": expected '" << m << "' in: " << msg;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "failed writes must leave nothing behind";

  absl::Status st = write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", DType::f32, {1}, four}});
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("no/such/dir"), std::string::npos) << st;
}

// ---- fuzzing ----------------------------------------------------------------------------------

// A valid file (a few tensors of several dtypes and metadata) as the seed for mutations.
Bytes seed_file() {
  TempDir dir;
  std::mt19937_64 rng(99);
  const Bytes a = random_bytes(rng, 4 * 6), b = random_bytes(rng, 2 * 5), c = random_bytes(rng, 8);
  const Bytes d = random_bytes(rng, 3, true);
  EXPECT_TRUE(write_safetensors(dir.file("seed.safetensors"),
                                {{"model.embed.weight", DType::f32, {2, 3}, a},
                                 {"model.norm.weight", DType::bf16, {5}, b},
                                 {"empty", DType::f16, {0, 4}, {}},
                                 {"step", DType::i64, {}, c},
                                 {"mask", DType::boolean, {3}, d}},
                                {{"format", "pt"}, {"note", "seed"}})
                  .ok());
  return read_all(dir.file("seed.safetensors"));
}

// Parses `b` and, on success, checks every invariant a caller relies on and touches every byte.
// Returns whether it parsed.
bool parse_and_check(const Bytes& b) {
  auto holder = std::make_shared<const Bytes>(b);
  auto f = SafetensorsFile::from_bytes(holder, kLabel);
  if (!f.ok()) {
    EXPECT_EQ(std::string(f.status().message()).rfind(kLabel, 0), 0u) << f.status();
    EXPECT_TRUE(f.status().code() == absl::StatusCode::kInvalidArgument ||
                f.status().code() == absl::StatusCode::kDataLoss)
        << f.status();
    return false;
  }
  uint64_t total = 0, sum = 0;
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_LE(t.offset + t.nbytes, b.size()) << t.name;
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    EXPECT_EQ(static_cast<uint64_t>(bytes_for(t.dtype, numel)), t.nbytes) << t.name;
    EXPECT_EQ(f->find(t.name), &t);
    for (uint8_t x : f->bytes(t)) sum += x;  // under ASan, an out-of-bounds span would be caught here
    total += t.nbytes;
  }
  EXPECT_LE(total, b.size());
  volatile uint64_t sink = sum;  // keep the reads
  (void)sink;
  return true;
}

TEST(SafetensorsFuzz, MutationsNeverCrash) {
  const Bytes seed = seed_file();
  ASSERT_TRUE(parse_and_check(seed));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | seed[i];
  const size_t header_end = 8 + n;
  std::mt19937_64 rng(20240601);
  auto pick = [&](size_t lo, size_t hi) { return lo + rng() % (hi - lo); };  // [lo, hi)
  int parsed = 0, rejected = 0;
  const int kIters = 3000;
  for (int it = 0; it < kIters; ++it) {
    // 1. truncation anywhere: only the full length can parse.
    {
      Bytes b(seed.begin(), seed.begin() + pick(0, seed.size()));
      EXPECT_FALSE(parse_and_check(b)) << "truncated to " << b.size();
    }
    // 2. random byte flips in the header.
    {
      Bytes b = seed;
      for (int k = 0, m = 1 + rng() % 4; k < m; ++k) b[pick(8, header_end)] ^= 1 + rng() % 255;
      parse_and_check(b) ? ++parsed : ++rejected;
    }
    // 3. header digits/punctuation replaced by plausible JSON characters: reaches the semantic checks.
    {
      Bytes b = seed;
      static const char kRepl[] = "0123456789-.,[]{}\" eE";
      for (int k = 0, m = 1 + rng() % 3; k < m; ++k) {
        size_t p = pick(8, header_end);
        for (int tries = 0; tries < 50 && !(b[p] >= '0' && b[p] <= '9'); ++tries) p = pick(8, header_end);
        b[p] = static_cast<uint8_t>(kRepl[rng() % (sizeof(kRepl) - 1)]);
      }
      parse_and_check(b) ? ++parsed : ++rejected;
    }
    // 4. random byte flips in the data region: opaque to the reader, must always parse.
    if (header_end < seed.size()) {
      Bytes b = seed;
      for (int k = 0; k < 4; ++k) b[pick(header_end, seed.size())] ^= 1 + rng() % 255;
      EXPECT_TRUE(parse_and_check(b));
    }
    // 5. random header-length values: anything, near the true one, or near the file size.
    {
      Bytes b = seed;
      uint64_t len;
      switch (rng() % 3) {
        case 0:
          len = rng() >> (rng() % 64);
          break;
        case 1:
          len = n + pick(0, 33) - 16;
          break;
        default:
          len = seed.size() - 8 + pick(0, 9) - 4;
          break;
      }
      for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(len >> (8 * i));
      EXPECT_EQ(parse_and_check(b), len == n) << "header length " << len;
    }
    // 6. a byte inserted or deleted inside the header (length unchanged), then random appended junk.
    {
      Bytes b = seed;
      const size_t p = pick(8, header_end);
      if (rng() & 1)
        b.insert(b.begin() + p, static_cast<uint8_t>(rng()));
      else
        b.erase(b.begin() + p);
      if (rng() & 1)
        for (int k = 0, m = rng() % 16; k < m; ++k) b.push_back(static_cast<uint8_t>(rng()));
      parse_and_check(b) ? ++parsed : ++rejected;
    }
  }
  // Most header mutations must be caught; a few (a flipped padding space, a changed name) are benign.
  EXPECT_GT(rejected, kIters);
  EXPECT_GT(parsed, 0);
  std::cout << "fuzz: " << parsed << " mutated headers parsed, " << rejected << " rejected\n";
}

// Header mutations at the JSON level (offsets, shapes, dtypes nudged; fields dropped; data resized),
// re-serialized with a correct length so they reach the layout checks (overlap, hole, trailing bytes).
TEST(SafetensorsFuzz, StructuredHeaderMutationsNeverCrash) {
  const Bytes seed = seed_file();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | seed[i];
  const auto header = nlohmann::json::parse(seed.begin() + 8, seed.begin() + 8 + n);
  const Bytes data(seed.begin() + 8 + n, seed.end());
  std::vector<std::string> names;
  for (const auto& [k, v] : header.items())
    if (k != "__metadata__") names.push_back(k);
  static const char* kDTypes[] = {"F32", "F64", "BF16", "F16", "I32", "I64", "U8", "BOOL", "I8", "U16", "X"};
  std::mt19937_64 rng(7);
  int parsed = 0, rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    nlohmann::json h = header;
    Bytes d = data;
    for (int k = 0, m = 1 + rng() % 3; k < m; ++k) {
      nlohmann::json& e = h[names[rng() % names.size()]];
      const int64_t delta = static_cast<int64_t>(rng() % 17) - 8;
      const bool has_offsets = e.contains("data_offsets"), has_shape = e.contains("shape");
      switch (rng() % 7) {
        case 0:  // one end moved: usually a size mismatch
          if (has_offsets) e["data_offsets"][rng() % 2] = e["data_offsets"][rng() % 2].get<int64_t>() + delta;
          break;
        case 1:  // the whole tensor moved: overlap, hole or trailing bytes
          if (has_offsets)
            for (auto& o : e["data_offsets"]) o = o.get<int64_t>() + delta;
          break;
        case 2:
          if (has_shape) e["shape"].push_back(rng() % 3);
          break;
        case 3:
          if (has_shape && !e["shape"].empty()) e["shape"][rng() % e["shape"].size()] = rng() % 4;
          break;
        case 4:
          e["dtype"] = kDTypes[rng() % std::size(kDTypes)];
          break;
        case 5:
          e.erase(std::vector<std::string>{"dtype", "shape", "data_offsets"}[rng() % 3]);
          break;
        default:
          d.resize(static_cast<size_t>(std::max<int64_t>(0, static_cast<int64_t>(d.size()) + delta)));
          break;
      }
    }
    std::string text = h.dump();
    text.append(rng() % 8, ' ');
    parse_and_check(assemble(text.size(), text, d)) ? ++parsed : ++rejected;
  }
  EXPECT_GT(rejected, 1000);
  std::cout << "structured fuzz: " << parsed << " parsed, " << rejected << " rejected\n";
}

}  // namespace
}  // namespace loom
