// GGUF parsing: a bounds-checked cursor over the mapped bytes. Every count is checked against the
// bytes left before anything is allocated for it, so a hostile file costs at most a small multiple
// of its own size in memory; every failure names the file, the field and its offset.
#include "engine/gguf.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/mapped_file.h"
#include "engine/status_macros.h"

namespace loom {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32

// The fewest bytes one element of `t` occupies in the file (for bounding counts before allocating).
uint64_t min_bytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    case GgufType::kString: return 8;    // the length
    case GgufType::kArray: return 4 + 8;  // element type + count
  }
  return 1;
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

}  // namespace

// Reads the file front to back; fails with the first problem found.
class GgufParser {
 public:
  GgufParser(const uint8_t* data, size_t size, const std::string& label) : d_(data), n_(size), label_(label) {}

  absl::Status parse(GgufFile* f) {
    if (n_ < 4) return truncated("the magic", 4);
    uint32_t magic;
    std::memcpy(&magic, d_, 4);
    if (magic != kMagic) {
      std::string got(reinterpret_cast<const char*>(d_), 4);
      for (char& c : got)
        if (c < 32 || c > 126) c = '?';
      return absl::InvalidArgumentError(
          absl::StrCat(label_, ": not a GGUF file (magic at offset 0 is '", got, "', expected 'GGUF')"));
    }
    pos_ = 4;
    uint32_t version;
    if (!u32(&version)) return truncated("the version", 4);
    if (version == 1)
      return absl::UnimplementedError(absl::StrCat(label_, ": GGUF version 1 (32-bit counts, 2023) is not supported; "
                                                   "re-convert the model with a current llama.cpp"));
    if (version == 0x02000000u || version == 0x03000000u)
      return absl::UnimplementedError(absl::StrCat(label_, ": a big-endian GGUF file; Loom reads little-endian ones"));
    if (version != 2 && version != 3)
      return absl::InvalidArgumentError(absl::StrCat(label_, ": GGUF version ", version, " at offset 4; Loom reads versions 2 and 3"));
    f->version_ = version;
    uint64_t n_tensors, n_kv;
    if (!u64(&n_tensors)) return truncated("the tensor count", 8);
    if (!u64(&n_kv)) return truncated("the metadata count", 8);
    // A metadata pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info 8 + 4 + 4 + 8.
    if (n_kv > left() / 13)
      return absl::InvalidArgumentError(absl::StrCat(label_, ": header at offset 16 claims ", n_kv,
                                                     " metadata pairs, more than the ", left(), " bytes left can hold"));
    for (uint64_t k = 0; k < n_kv; ++k) LOOM_RETURN_IF_ERROR(read_kv(f, k));
    LOOM_RETURN_IF_ERROR(read_alignment(f));
    if (n_tensors > left() / 24)
      return absl::InvalidArgumentError(absl::StrCat(label_, ": header at offset 8 claims ", n_tensors,
                                                     " tensors, more than the ", left(), " bytes left can hold"));
    f->tensors_.reserve(n_tensors);
    for (uint64_t t = 0; t < n_tensors; ++t) LOOM_RETURN_IF_ERROR(read_tensor_info(f, t));
    const uint64_t a = f->alignment_;
    const uint64_t data_offset = (pos_ + a - 1) / a * a;
    if (!f->tensors_.empty() && data_offset > n_)
      return absl::DataLossError(absl::StrCat(label_, ": truncated: the tensor data starts at offset ", data_offset,
                                              " but the file has ", n_, " bytes"));
    f->data_offset_ = data_offset;
    return check_tensor_data(f);
  }

 private:

  uint64_t left() const { return n_ - pos_; }
  template <class T>
  bool read(T* v) {
    if (left() < sizeof(T)) return false;
    std::memcpy(v, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool u32(uint32_t* v) { return read(v); }
  bool u64(uint64_t* v) { return read(v); }

  absl::Status truncated(const std::string& what, uint64_t need) const {
    return absl::DataLossError(absl::StrCat(label_, ": truncated: ", what, " at offset ", pos_, " needs ", need,
                                            " bytes, the file has ", left(), " left"));
  }

  absl::Status string(std::string* s, const std::string& what) {
    const uint64_t at = pos_;
    uint64_t len;
    if (!u64(&len)) return truncated(absl::StrCat("the length of ", what), 8);
    if (len > left()) {
      pos_ = at;
      return absl::DataLossError(absl::StrCat(label_, ": ", what, " at offset ", at, " claims ", len,
                                              " bytes, but only ", left() - 8, " remain in the file"));
    }
    s->assign(reinterpret_cast<const char*>(d_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

  absl::Status value(GgufType t, GgufValue* v, const std::string& what, int depth) {
    v->type = t;
    const uint64_t at = pos_;
    auto need = [&](uint64_t n) { return truncated(absl::StrCat(what, " (", gguf_type_name(t), ")"), n); };
    switch (t) {
      case GgufType::kUint8: { uint8_t x; if (!read(&x)) return need(1); v->u = x; return absl::OkStatus(); }
      case GgufType::kInt8: { int8_t x; if (!read(&x)) return need(1); v->i = x; return absl::OkStatus(); }
      case GgufType::kUint16: { uint16_t x; if (!read(&x)) return need(2); v->u = x; return absl::OkStatus(); }
      case GgufType::kInt16: { int16_t x; if (!read(&x)) return need(2); v->i = x; return absl::OkStatus(); }
      case GgufType::kUint32: { uint32_t x; if (!read(&x)) return need(4); v->u = x; return absl::OkStatus(); }
      case GgufType::kInt32: { int32_t x; if (!read(&x)) return need(4); v->i = x; return absl::OkStatus(); }
      case GgufType::kUint64: { uint64_t x; if (!read(&x)) return need(8); v->u = x; return absl::OkStatus(); }
      case GgufType::kInt64: { int64_t x; if (!read(&x)) return need(8); v->i = x; return absl::OkStatus(); }
      case GgufType::kFloat32: { float x; if (!read(&x)) return need(4); v->f = x; return absl::OkStatus(); }
      case GgufType::kFloat64: { double x; if (!read(&x)) return need(8); v->f = x; return absl::OkStatus(); }
      case GgufType::kBool: {
        uint8_t x;
        if (!read(&x)) return need(1);
        if (x > 1)
          return absl::InvalidArgumentError(
              absl::StrCat(label_, ": ", what, " at offset ", at, " is a bool holding ", int{x}, ", expected 0 or 1"));
        v->u = x;
        return absl::OkStatus();
      }
      case GgufType::kString: return string(&v->str, what);
      case GgufType::kArray: {
        if (depth >= kGgufMaxArrayNesting)
          return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " at offset ", at, " nests arrays more than ",
                                                         kGgufMaxArrayNesting, " deep"));
        uint32_t et;
        uint64_t count;
        if (!u32(&et)) return need(4);
        if (!valid_type(et))
          return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " at offset ", at,
                                                         " is an array of unknown value type ", et, " (known: 0-12)"));
        if (!u64(&count)) return need(8);
        const GgufType elem = static_cast<GgufType>(et);
        if (count > left() / min_bytes(elem))
          return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " at offset ", at, " claims ", count, " ",
                                                         gguf_type_name(elem), " elements, more than the ", left(),
                                                         " bytes left in the file can hold"));
        if (count > items_left_)
          return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " at offset ", at, " claims ", count,
                                                         " elements; Loom reads at most ", kGgufMaxMetadataItems,
                                                         " metadata array elements per file"));
        items_left_ -= count;
        v->elem_type = elem;
        v->items.resize(count);
        for (uint64_t k = 0; k < count; ++k)
          LOOM_RETURN_IF_ERROR(value(elem, &v->items[k], absl::StrCat(what, "[", k, "]"), depth + 1));
        return absl::OkStatus();
      }
    }
    return absl::InternalError("unreachable GGUF value type");
  }

  absl::Status read_kv(GgufFile* f, uint64_t k) {
    GgufKv kv;
    kv.offset = pos_;
    LOOM_RETURN_IF_ERROR(string(&kv.key, absl::StrCat("metadata key #", k)));
    const std::string what = absl::StrCat("metadata '", kv.key, "'");
    uint32_t t;
    const uint64_t type_at = pos_;
    if (!u32(&t)) return truncated(absl::StrCat("the type of ", what), 4);
    if (!valid_type(t))
      return absl::InvalidArgumentError(
          absl::StrCat(label_, ": ", what, " at offset ", type_at, " has unknown value type ", t, " (known: 0-12)"));
    LOOM_RETURN_IF_ERROR(value(static_cast<GgufType>(t), &kv.value, what, 0));
    if (f->kv_index_.count(kv.key))
      return absl::InvalidArgumentError(
          absl::StrCat(label_, ": metadata key '", kv.key, "' at offset ", kv.offset, " appears twice"));
    f->kv_index_.emplace(kv.key, f->kvs_.size());
    f->kvs_.push_back(std::move(kv));
    return absl::OkStatus();
  }

  absl::Status read_alignment(GgufFile* f) {
    const GgufKv* kv = f->find("general.alignment");
    if (!kv) return absl::OkStatus();
    const GgufValue& v = kv->value;
    if (v.type != GgufType::kUint32)
      return absl::InvalidArgumentError(absl::StrCat(label_, ": metadata 'general.alignment' at offset ", kv->offset,
                                                     " is a ", gguf_type_name(v.type), ", expected uint32"));
    if (v.u == 0 || (v.u & (v.u - 1)) != 0)
      return absl::InvalidArgumentError(absl::StrCat(label_, ": metadata 'general.alignment' at offset ", kv->offset,
                                                     " is ", v.u, ", expected a power of two"));
    f->alignment_ = static_cast<uint32_t>(v.u);
    return absl::OkStatus();
  }

  absl::Status read_tensor_info(GgufFile* f, uint64_t t) {
    GgufTensorInfo ti;
    ti.info_offset = pos_;
    LOOM_RETURN_IF_ERROR(string(&ti.name, absl::StrCat("the name of tensor #", t)));
    const std::string what = absl::StrCat("tensor '", ti.name, "' (info at offset ", ti.info_offset, ")");
    uint32_t n_dims;
    if (!u32(&n_dims)) return truncated(absl::StrCat("the dimension count of ", what), 4);
    if (n_dims == 0 || n_dims > kGgufMaxDims)
      return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " has ", n_dims, " dimensions, expected 1 to ", kGgufMaxDims));
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne;
      if (!u64(&ne)) return truncated(absl::StrCat("dimension ", d, " of ", what), 8);
      if (ne > (1ull << 62) || (ne != 0 && static_cast<uint64_t>(numel) > (1ull << 62) / ne))
        return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " has dimension ", d, " = ", ne,
                                                       ": the element count overflows"));
      ti.ne.push_back(static_cast<int64_t>(ne));
      numel *= static_cast<int64_t>(ne);
    }
    ti.numel = numel;
    uint32_t type;
    const uint64_t type_at = pos_;
    if (!u32(&type)) return truncated(absl::StrCat("the type of ", what), 4);
    const auto tr = ggml_type_traits(type);
    if (!tr)
      return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " has unknown ggml type ", type, " at offset ", type_at));
    ti.type = tr->type;
    if (ti.ne[0] % tr->block_elems != 0)
      return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " is ", tr->name, " with rows of ", ti.ne[0],
                                                     " elements, not a multiple of its ", tr->block_elems, "-element blocks"));
    // Checked before multiplying: 2^62 f32 elements are 2^64 bytes, which would wrap to 0.
    const uint64_t blocks = static_cast<uint64_t>(numel / tr->block_elems);
    if (blocks > n_ / static_cast<uint64_t>(tr->block_bytes))
      return absl::DataLossError(absl::StrCat(label_, ": ", what, " is ", tr->name, " with ", numel, " elements (",
                                              blocks, " blocks of ", tr->block_bytes, " bytes), more than the ", n_,
                                              " bytes of the whole file"));
    ti.nbytes = blocks * static_cast<uint64_t>(tr->block_bytes);
    if (!u64(&ti.offset)) return truncated(absl::StrCat("the data offset of ", what), 8);
    if (f->tensor_index_.count(ti.name))
      return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, ": a second tensor of that name"));
    f->tensor_index_.emplace(ti.name, f->tensors_.size());
    f->tensors_.push_back(std::move(ti));
    return absl::OkStatus();
  }

  absl::Status check_tensor_data(GgufFile* f) {
    const uint64_t data_size = n_ - f->data_offset_;
    for (GgufTensorInfo& ti : f->tensors_) {
      const std::string what = absl::StrCat("tensor '", ti.name, "' (info at offset ", ti.info_offset, ")");
      if (ti.offset % f->alignment_ != 0)
        return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what, " has data offset ", ti.offset,
                                                       ", not a multiple of the alignment ", f->alignment_));
      if (ti.offset > data_size || ti.nbytes > data_size - ti.offset)
        return absl::DataLossError(absl::StrCat(label_, ": truncated or corrupt: ", what, " needs bytes [", ti.offset,
                                                ", ", ti.offset > ~0ull - ti.nbytes ? std::string("2^64+") : absl::StrCat(ti.offset + ti.nbytes),
                                                ") of the data section at offset ",
                                                f->data_offset_, ", which holds ", data_size, " bytes"));
      ti.offset += f->data_offset_;
    }
    return check_no_overlap(*f);
  }

  // Two tensors sharing bytes would alias each other's weights (llama.cpp never writes that; a
  // crafted file could): refused naming both, as the safetensors reader does.
  absl::Status check_no_overlap(const GgufFile& f) const {
    std::vector<const GgufTensorInfo*> by_offset;
    for (const GgufTensorInfo& ti : f.tensors_)
      if (ti.nbytes > 0) by_offset.push_back(&ti);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensorInfo& prev = *by_offset[i - 1];
      const GgufTensorInfo& t = *by_offset[i];
      if (t.offset < prev.offset + prev.nbytes)
        return absl::InvalidArgumentError(absl::StrCat(
            label_, ": tensor '", t.name, "' (bytes [", t.offset, ", ", t.offset + t.nbytes, ") of the file) overlaps tensor '",
            prev.name, "' (bytes [", prev.offset, ", ", prev.offset + prev.nbytes, ")): each tensor needs its own data"));
    }
    return absl::OkStatus();
  }

  const uint8_t* d_;
  uint64_t n_;
  uint64_t pos_ = 0;
  uint64_t items_left_ = kGgufMaxMetadataItems;
  const std::string& label_;
};

const char* gguf_type_name(GgufType t) {
  static constexpr const char* kNames[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32", "float32",
                                                "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kUint16: case GgufType::kInt16:
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kUint64: case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

Shape GgufTensorInfo::shape() const { return Shape(ne.rbegin(), ne.rend()); }

absl::StatusOr<GgufFile> GgufFile::open(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  auto owner = std::make_shared<MappedFile>(std::move(*mapped));
  GgufFile f;
  f.keepalive_ = owner;
  f.data_ = owner->data();
  f.size_ = owner->size();
  f.path_ = path;
  GgufParser p(f.data_, f.size_, f.path_);
  if (absl::Status s = p.parse(&f); !s.ok()) return s;
  return f;
}

absl::StatusOr<GgufFile> GgufFile::from_bytes(std::shared_ptr<const std::vector<uint8_t>> bytes, std::string label) {
  GgufFile f;
  f.data_ = bytes->data();
  f.size_ = bytes->size();
  f.keepalive_ = std::move(bytes);
  f.path_ = std::move(label);
  GgufParser p(f.data_, f.size_, f.path_);
  if (absl::Status s = p.parse(&f); !s.ok()) return s;
  return f;
}

}  // namespace loom
