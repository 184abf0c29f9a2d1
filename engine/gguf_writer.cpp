// GGUF v3 writer: header, metadata, tensor infos, aligned tensor data (see engine/gguf_writer.h).
// The file is streamed to `<path>.tmp.<pid>` and renamed, so a failed or interrupted export never
// leaves a truncated .gguf under the final name.
#include "engine/gguf_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/common.h"

namespace loom {
namespace {

GgufValue scalar(GgufType t) {
  GgufValue v;
  v.type = t;
  return v;
}

// Buffered little-endian output to a FILE*; the first failure sticks.
class Out {
 public:
  explicit Out(std::FILE* f) : f_(f) {}
  void bytes(const void* p, size_t n) {
    if (ok_ && n && std::fwrite(p, 1, n, f_) != n) ok_ = false;
    pos_ += n;
  }
  template <class T>
  void put(T v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[256] = {};
    while (pos_ % alignment) bytes(zeros, std::min<uint64_t>(alignment - pos_ % alignment, sizeof zeros));
  }
  uint64_t pos() const { return pos_; }
  bool ok() const { return ok_; }

 private:
  std::FILE* f_;
  uint64_t pos_ = 0;
  bool ok_ = true;
};

void put_value(Out& o, const GgufValue& v) {
  switch (v.type) {
    case GgufType::kUint8: o.put<uint8_t>(static_cast<uint8_t>(v.u)); return;
    case GgufType::kInt8: o.put<int8_t>(static_cast<int8_t>(v.i)); return;
    case GgufType::kUint16: o.put<uint16_t>(static_cast<uint16_t>(v.u)); return;
    case GgufType::kInt16: o.put<int16_t>(static_cast<int16_t>(v.i)); return;
    case GgufType::kUint32: o.put<uint32_t>(static_cast<uint32_t>(v.u)); return;
    case GgufType::kInt32: o.put<int32_t>(static_cast<int32_t>(v.i)); return;
    case GgufType::kUint64: o.put<uint64_t>(v.u); return;
    case GgufType::kInt64: o.put<int64_t>(v.i); return;
    case GgufType::kFloat32: o.put<float>(static_cast<float>(v.f)); return;
    case GgufType::kFloat64: o.put<double>(v.f); return;
    case GgufType::kBool: o.put<uint8_t>(v.u ? 1 : 0); return;
    case GgufType::kString: o.str(v.str); return;
    case GgufType::kArray:
      o.put<uint32_t>(static_cast<uint32_t>(v.elem_type));
      o.put<uint64_t>(v.items.size());
      for (const GgufValue& item : v.items) put_value(o, item);
      return;
  }
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

GgufValue gguf_u32(uint32_t x) { GgufValue v = scalar(GgufType::kUint32); v.u = x; return v; }
GgufValue gguf_i32(int32_t x) { GgufValue v = scalar(GgufType::kInt32); v.i = x; return v; }
GgufValue gguf_f32(float x) { GgufValue v = scalar(GgufType::kFloat32); v.f = x; return v; }
GgufValue gguf_bool(bool x) { GgufValue v = scalar(GgufType::kBool); v.u = x; return v; }
GgufValue gguf_string(std::string x) { GgufValue v = scalar(GgufType::kString); v.str = std::move(x); return v; }

GgufValue gguf_strings(const std::vector<std::string>& xs) {
  GgufValue v = scalar(GgufType::kArray);
  v.elem_type = GgufType::kString;
  for (const std::string& x : xs) v.items.push_back(gguf_string(x));
  return v;
}
GgufValue gguf_i32s(const std::vector<int32_t>& xs) {
  GgufValue v = scalar(GgufType::kArray);
  v.elem_type = GgufType::kInt32;
  for (int32_t x : xs) v.items.push_back(gguf_i32(x));
  return v;
}
GgufValue gguf_f32s(const std::vector<float>& xs) {
  GgufValue v = scalar(GgufType::kArray);
  v.elem_type = GgufType::kFloat32;
  for (float x : xs) v.items.push_back(gguf_f32(x));
  return v;
}

void gguf_encode_row(GgmlType type, const float* src, int64_t n, uint8_t* dst) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const bf16 b = float_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &b.bits, 2);
      }
      return;
    case GgmlType::Q8_0: {
      LOOM_CHECK(n % kQK == 0, "gguf_encode_row: Q8_0 needs a multiple of ", kQK, " elements, got ", n);
      std::vector<BlockQ8_0> blocks(n / kQK);  // dst may be unaligned for the 2-byte scale
      cpu::quantize_row_q8_0(src, blocks.data(), n);
      std::memcpy(dst, blocks.data(), blocks.size() * sizeof(BlockQ8_0));
      return;
    }
    default: LOOM_CHECK(false, "gguf_encode_row: Loom writes F32, F16, BF16 and Q8_0, not ", ggml_type_name(type));
  }
}

void GgufWriter::add(std::string key, GgufValue value) {
  LOOM_CHECK(!has(key) && key != "general.alignment", "GgufWriter::add: metadata key '", key, "' added twice");
  kvs_.emplace_back(std::move(key), std::move(value));
}

bool GgufWriter::has(const std::string& key) const {
  for (const auto& kv : kvs_)
    if (kv.first == key) return true;
  return false;
}

void GgufWriter::add_tensor(std::string name, Tensor f32, GgmlType type) {
  LOOM_CHECK(f32.dtype() == DType::f32 && f32.is_cpu() && f32.is_contiguous() && f32.dim() >= 1 && f32.dim() <= kGgufMaxDims,
             "GgufWriter::add_tensor: '", name, "' is ", f32.str(), ", expected a contiguous f32 CPU tensor of 1-4 dims");
  const auto tr = ggml_type_traits(static_cast<uint32_t>(type));
  LOOM_CHECK(tr && (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16 || type == GgmlType::Q8_0),
             "GgufWriter::add_tensor: '", name, "': Loom writes F32, F16, BF16 and Q8_0");
  const int64_t row = f32.size(-1);
  LOOM_CHECK(row % tr->block_elems == 0, "GgufWriter::add_tensor: '", name, "' has rows of ", row, " elements, not a multiple of ",
             tr->name, "'s ", tr->block_elems);
  for (const Entry& e : tensors_) LOOM_CHECK(e.name != name, "GgufWriter::add_tensor: '", name, "' added twice");
  const uint64_t nbytes = static_cast<uint64_t>(f32.numel() / tr->block_elems) * tr->block_bytes;
  uint64_t offset = 0;
  if (!tensors_.empty()) {
    const Entry& last = tensors_.back();
    offset = (last.offset + last.nbytes + alignment_ - 1) / alignment_ * alignment_;
  }
  tensors_.push_back({std::move(name), std::move(f32), type, nbytes, offset});
}

absl::Status GgufWriter::write(const std::string& path) const {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
  if (!f) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  auto fail = [&](const char* what) {
    const int err = errno;
    f.reset();
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot ", what, " ", tmp, ": ", std::strerror(err)));
  };
  Out o(f.get());
  o.put<uint32_t>(0x46554747u);  // "GGUF"
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kvs_.size() + 1);
  // general.alignment right after general.architecture (llama.cpp reads the keys in any order).
  bool aligned_written = false;
  auto put_alignment = [&] {
    o.str("general.alignment");
    o.put<uint32_t>(static_cast<uint32_t>(GgufType::kUint32));
    o.put<uint32_t>(alignment_);
    aligned_written = true;
  };
  for (const auto& [key, value] : kvs_) {
    o.str(key);
    o.put<uint32_t>(static_cast<uint32_t>(value.type));
    put_value(o, value);
    if (key == "general.architecture") put_alignment();
  }
  if (!aligned_written) put_alignment();
  for (const Entry& e : tensors_) {
    o.str(e.name);
    o.put<uint32_t>(static_cast<uint32_t>(e.data.dim()));
    for (int64_t d = e.data.dim() - 1; d >= 0; --d) o.put<uint64_t>(e.data.size(d));
    o.put<uint32_t>(static_cast<uint32_t>(e.type));
    o.put<uint64_t>(e.offset);
  }
  o.pad_to(alignment_);
  const uint64_t data_start = o.pos();
  std::vector<uint8_t> buf;
  for (const Entry& e : tensors_) {
    o.pad_to(alignment_);
    LOOM_CHECK(o.pos() - data_start == e.offset, "GgufWriter: data of '", e.name, "' misplaced");
    // Row by row into one reused buffer (rows are whole blocks).
    const int64_t row = e.data.size(-1), rows = e.data.numel() / row;
    const uint64_t row_bytes = e.nbytes / static_cast<uint64_t>(rows);
    constexpr int64_t kChunkRows = 256;
    const float* src = e.data.data<float>();
    for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
      const int64_t nr = std::min(kChunkRows, rows - r0);
      buf.resize(nr * row_bytes);
#pragma omp parallel for schedule(static) if (nr * row > (1 << 16))
      for (int64_t r = 0; r < nr; ++r) gguf_encode_row(e.type, src + (r0 + r) * row, row, buf.data() + r * row_bytes);
      o.bytes(buf.data(), buf.size());
    }
    if (!o.ok()) return fail("write");
  }
  if (!o.ok()) return fail("write");
  if (std::fflush(f.get()) != 0 || fsync(fileno(f.get())) != 0) return fail("flush");
  if (std::fclose(f.release()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot close ", tmp, ": ", std::strerror(err)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace loom
