// Safetensors reader (header parsing and validation over a MappedFile or in-memory bytes) and the
// atomic writer. Validation follows the reference implementation: the tensors must cover the data
// region contiguously, without holes, overlaps or trailing bytes.
#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/mapped_file.h"
#include "kernels/error.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using nlohmann::json;

// Every dtype name the safetensors format defines; those Loom cannot store are reported by name.
constexpr std::string_view kKnownSafetensorsDTypes[] = {
    "BOOL", "U8",  "I8",  "I16",     "U16",     "F16",     "BF16",    "I32",     "U32", "F32",
    "F64",  "I64", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64"};

std::string supported_dtypes() {
  std::vector<std::string> names;  // (Debian's abseil has its own string_view: convert)
  for (const auto& tr : kDTypeTraits)
    if (!tr.safetensors.empty()) names.emplace_back(tr.safetensors);
  return absl::StrJoin(names, " ");
}

// A short, printable rendering of a JSON value for error messages.
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string dims_str(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// True (and *out set) when v is an integer >= 0.
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// Deepest JSON nesting a header may have (a real one has 3). A pre-scan enforces it so that a
// hostile "[[[[..." header cannot make the parser build millions of nested values.
constexpr int kMaxHeaderDepth = 64;

bool nesting_within(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// The header as JSON, or an error; duplicate keys (which nlohmann would silently collapse) are an
// error at any depth.
absl::StatusOr<json> parse_header(std::string_view text, const std::string& label) {
  if (!nesting_within(text, kMaxHeaderDepth))
    return absl::InvalidArgumentError(absl::StrCat(label, ": safetensors header nests JSON deeper than ",
                                                   kMaxHeaderDepth, " levels (expected 3)"));
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty() && parsed.is_string()) {
      if (!keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
  if (header.is_discarded())
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": safetensors header is not valid JSON (expected a UTF-8 JSON object of ",
                     text.size(), " bytes after the 8-byte length)"));
  if (!duplicate.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": safetensors header has the key '", duplicate, "' twice"));
  if (!header.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": safetensors header is a JSON ", header.type_name(), ", expected an object"));
  return header;
}

absl::Status parse_metadata(const json& m, const std::string& label,
                            std::map<std::string, std::string>* out) {
  if (!m.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": __metadata__ is a JSON ", m.type_name(), ", expected an object of strings"));
  for (const auto& [k, v] : m.items()) {
    if (!v.is_string())
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": __metadata__ entry '", k, "' is ", show(v), ", expected a string"));
    (*out)[k] = v.get<std::string>();
  }
  return absl::OkStatus();
}

// One header entry -> TensorInfo with offset = data_offsets[0] (relative to the data region) and
// nbytes checked against numel * element size and against the data region's size.
absl::StatusOr<TensorInfo> parse_entry(const std::string& name, const json& e, uint64_t data_size,
                                       const std::string& label) {
  const std::string at = absl::StrCat(label, ": tensor '", name, "': ");
  if (!e.is_object())
    return absl::InvalidArgumentError(absl::StrCat(at, "header entry is a JSON ", e.type_name(),
                                                   ", expected an object with dtype, shape, data_offsets"));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!e.contains(field))
      return absl::InvalidArgumentError(absl::StrCat(at, "header entry has no '", field, "'"));

  TensorInfo info;
  info.name = name;
  const json& jd = e["dtype"];
  if (!jd.is_string())
    return absl::InvalidArgumentError(absl::StrCat(at, "dtype is ", show(jd), ", expected a string"));
  const std::string ds = jd.get<std::string>();
  const auto dtype = dtype_from_safetensors(ds);
  if (!dtype) {
    const bool known = std::find(std::begin(kKnownSafetensorsDTypes), std::end(kKnownSafetensorsDTypes),
                                 ds) != std::end(kKnownSafetensorsDTypes);
    return absl::InvalidArgumentError(absl::StrCat(at, known ? "dtype " : "unknown dtype '", ds,
                                                   known ? " is not supported by Loom" : "'",
                                                   " (supported: ", supported_dtypes(), ")"));
  }
  info.dtype = *dtype;

  const json& js = e["shape"];
  if (!js.is_array())
    return absl::InvalidArgumentError(
        absl::StrCat(at, "shape is ", show(js), ", expected an array of non-negative integers"));
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : js) {
    uint64_t n;
    if (!as_u64(d, &n) || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return absl::InvalidArgumentError(absl::StrCat(at, "shape ", show(js), " has the entry ", show(d),
                                                     ", expected non-negative integers"));
    info.shape.push_back(static_cast<int64_t>(n));
    overflow = overflow || __builtin_mul_overflow(numel, n, &numel);
  }
  uint64_t expected = 0;
  const auto& tr = traits(info.dtype);  // block_elems == 1 for every safetensors dtype
  if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(tr.block_bytes), &expected) ||
      expected > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return absl::InvalidArgumentError(
        absl::StrCat(at, "shape ", dims_str(info.shape), " overflows 64-bit element/byte counts"));

  const json& jo = e["data_offsets"];
  uint64_t begin = 0, end = 0;
  if (!jo.is_array() || jo.size() != 2 || !as_u64(jo[0], &begin) || !as_u64(jo[1], &end) || end < begin)
    return absl::InvalidArgumentError(
        absl::StrCat(at, "data_offsets is ", show(jo),
                     ", expected two non-negative integers [begin, end] with begin <= end"));
  if (end - begin != expected)
    return absl::InvalidArgumentError(absl::StrCat(at, "data_offsets [", begin, ", ", end, "] hold ",
                                                   end - begin, " bytes, expected ", expected, " for ", ds,
                                                   " ", dims_str(info.shape)));
  if (end > data_size)
    return absl::DataLossError(absl::StrCat(at, "data_offsets [", begin, ", ", end,
                                            "] run past the end of the data region (", data_size,
                                            " bytes): the file is truncated or its header is corrupt"));
  info.offset = begin;
  info.nbytes = end - begin;
  return info;
}

}  // namespace

absl::StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  auto owner = std::make_shared<const MappedFile>(std::move(*mapped));
  const uint8_t* data = owner->data();
  const size_t size = owner->size();
  return parse(std::move(owner), data, size, path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::from_bytes(std::shared_ptr<const std::vector<uint8_t>> bytes,
                                                            std::string label) {
  if (bytes == nullptr) return absl::InvalidArgumentError(absl::StrCat(label, ": no bytes given"));
  const uint8_t* data = bytes->data();
  const size_t size = bytes->size();
  return parse(std::move(bytes), data, size, std::move(label));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::parse(std::shared_ptr<const void> keepalive,
                                                       const uint8_t* data, size_t size, std::string label) {
  if (size < 8)
    return absl::DataLossError(
        absl::StrCat(label, ": file is ", size,
                     " bytes, too short for a safetensors file (expected an 8-byte header length)"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian u64
  if (n > kSafetensorsMaxHeaderBytes)
    return absl::InvalidArgumentError(absl::StrCat(label, ": header length ", n, " exceeds the ",
                                                   kSafetensorsMaxHeaderBytes,
                                                   "-byte limit (not a safetensors file, or corrupt)"));
  if (n > size - 8)
    return absl::DataLossError(absl::StrCat(label, ": header length ", n, " runs past the end of the ", size,
                                            "-byte file (truncated?)"));
  auto header = parse_header(std::string_view(reinterpret_cast<const char*>(data) + 8, n), label);
  if (!header.ok()) return header.status();

  SafetensorsFile f;
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  for (const auto& [key, value] : header->items()) {
    if (key == "__metadata__") {
      if (auto st = parse_metadata(value, label, &f.metadata_); !st.ok()) return st;
      continue;
    }
    auto info = parse_entry(key, value, data_size, label);
    if (!info.ok()) return info.status();
    f.tensors_.push_back(std::move(*info));
  }

  // File order; empty tensors sort before a tensor starting at the same offset.
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.offset, a.nbytes, a.name) < std::tie(b.offset, b.nbytes, b.name);
  });
  uint64_t covered = 0;  // the data region [0, covered) is accounted for
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : f.tensors_) {
    if (t.offset < covered)
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": tensor '", t.name, "' (data_offsets [", t.offset, ", ", t.offset + t.nbytes,
                       "]) overlaps tensor '", prev->name, "' (which ends at ", covered, ")"));
    if (t.offset > covered)
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": tensor '", t.name, "' starts at data offset ", t.offset, " but the previous tensor ",
          prev ? absl::StrCat("'", prev->name, "'") : std::string("(none)"), " ends at ", covered,
          ": safetensors data must be contiguous, without holes"));
    covered = t.offset + t.nbytes;
    prev = &t;
  }
  if (covered != data_size)
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": the tensors cover ", covered, " bytes of data but the file holds ", data_size,
                     " after the header (", data_size - covered, " trailing bytes belong to no tensor",
                     prev ? absl::StrCat("; the last tensor is '", prev->name, "'") : std::string(), ")"));

  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    f.tensors_[i].offset += data_start;
    f.index_.emplace(f.tensors_[i].name, i);
  }
  f.keepalive_ = std::move(keepalive);
  f.data_ = data;
  f.size_ = size;
  f.path_ = std::move(label);
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& info) const {
  LOOM_CHECK(info.offset <= size_ && info.nbytes <= size_ - info.offset, "SafetensorsFile::bytes: tensor '",
             info.name, "' [", info.offset, ", +", info.nbytes, ") lies outside ", path_, " (", size_,
             " bytes); was the TensorInfo taken from another file?");
  return {data_ + info.offset, static_cast<size_t>(info.nbytes)};
}

// ---- writer ----------------------------------------------------------------------------------

namespace {

// write(2) until all bytes are out (it may write less than asked, and at most ~2 GiB per call).
absl::Status write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": write failed"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Closes the descriptor and removes the temporary file unless `keep` is set.
struct TempFile {
  std::string path;
  int fd = -1;
  bool keep = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!keep) ::unlink(path.c_str());
  }
};

}  // namespace

absl::Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  // The header keeps the tensors in the order given (ordered_json), metadata first.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string at = absl::StrCat(path, ": tensor '", t.name, "': ");
    if (t.name == "__metadata__")
      return absl::InvalidArgumentError(absl::StrCat(at, "the name __metadata__ is reserved by the format"));
    if (!names.insert(t.name).second)
      return absl::InvalidArgumentError(absl::StrCat(at, "duplicate tensor name"));
    const auto& tr = traits(t.dtype);
    if (tr.safetensors.empty())
      return absl::InvalidArgumentError(
          absl::StrCat(at, "dtype ", std::string(tr.name),
                       " has no safetensors name (store packed data as U8 with its own shape)"));
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return absl::InvalidArgumentError(
            absl::StrCat(at, "shape ", dims_str(t.shape), " has a negative dimension"));
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
        return absl::InvalidArgumentError(absl::StrCat(at, "shape ", dims_str(t.shape), " overflows"));
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(tr.block_bytes), &nbytes) ||
        nbytes != t.data.size())
      return absl::InvalidArgumentError(absl::StrCat(at, "has ", t.data.size(), " bytes of data, expected ",
                                                     numel, " x ", tr.block_bytes, " for ",
                                                     std::string(tr.safetensors), " ", dims_str(t.shape)));
    auto& e = header[t.name] = nlohmann::ordered_json::object();
    e["dtype"] = std::string(tr.safetensors);
    e["shape"] = t.shape;
    e["data_offsets"] = nlohmann::ordered_json::array({offset, offset + nbytes});
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  } catch (const nlohmann::ordered_json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a tensor name or metadata string is not valid UTF-8 (", e.what(), ")"));
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  TempFile tmp;
  tmp.path = absl::StrCat(path, ".tmp.", ::getpid());
  do {
    tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (tmp.fd < 0 && errno == EINTR);
  if (tmp.fd < 0) {
    tmp.keep = true;  // nothing was created
    return absl::ErrnoToStatus(errno, absl::StrCat(tmp.path, ": cannot create"));
  }
  if (auto st = write_all(tmp.fd, len, 8, tmp.path); !st.ok()) return st;
  if (auto st = write_all(tmp.fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), tmp.path);
      !st.ok())
    return st;
  for (const TensorToWrite& t : tensors)
    if (auto st = write_all(tmp.fd, t.data.data(), t.data.size(), tmp.path); !st.ok()) return st;
  if (::fsync(tmp.fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(tmp.path, ": fsync failed"));
  const int fd = std::exchange(tmp.fd, -1);
  if (::close(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(tmp.path, ": close failed"));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot rename ", tmp.path, " onto it"));
  tmp.keep = true;

  // Make the rename itself durable; best effort (some filesystems refuse fsync on directories).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace loom
