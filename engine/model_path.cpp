// Model and tokenizer path checks (see model_path.h): the file system, then the first bytes.
#include "engine/model_path.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace fs = std::filesystem;

namespace {

// Bytes read to tell the kinds apart: enough for a JSONL file's first line in most data sets.
constexpr size_t kSniffBytes = 64 << 10;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// A JSON text's first line that parses on its own, followed by more text: one value per line.
bool looks_like_jsonl(std::string_view head) {
  const size_t nl = head.find('\n');
  if (nl == std::string_view::npos) return false;
  const nlohmann::json first = nlohmann::json::parse(head.substr(0, nl), nullptr, false);
  if (first.is_discarded()) return false;
  for (size_t i = nl + 1; i < head.size(); ++i)
    if (!is_space(head[i])) return head[i] == '{' || head[i] == '[';
  return false;
}

// owner/name as the Hugging Face hub spells ids: one slash, letters, digits, '-', '_', '.'.
bool looks_like_hub_id(const std::string& path) {
  const size_t slash = path.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == path.size() || path.find('/', slash + 1) != std::string::npos)
    return false;
  if (path[0] == '.' || path[0] == '~') return false;
  for (char c : path)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) return false;
  std::error_code ec;
  return !fs::exists(path.substr(0, slash), ec);  // an existing local folder "owner" means a local path
}

}  // namespace

PathKind sniff_path(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return PathKind::kMissing;
  if (fs::is_directory(path, ec)) return PathKind::kFolder;
  std::ifstream f(path, std::ios::binary);
  std::string head(kSniffBytes, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(f.gcount()));
  if (head.empty()) return PathKind::kEmpty;
  if (head.rfind("GGUF", 0) == 0) return PathKind::kGguf;
  if (head.rfind("PK\x03\x04", 0) == 0) return PathKind::kZip;
  if (head.size() > 9) {  // safetensors: an 8-byte little-endian header length, then the JSON header
    uint64_t n = 0;
    std::memcpy(&n, head.data(), 8);
    const uintmax_t size = fs::file_size(path, ec);
    if (!ec && head[8] == '{' && n >= 2 && n <= size - 8) return PathKind::kSafetensors;
  }
  size_t i = 0;
  while (i < head.size() && is_space(head[i])) ++i;
  if (i < head.size() && (head[i] == '{' || head[i] == '[')) {
    return looks_like_jsonl(std::string_view(head).substr(i)) ? PathKind::kJsonl : PathKind::kJson;
  }
  for (unsigned char c : head)
    if (c == 0 || (c < 0x20 && !is_space(static_cast<char>(c)))) return PathKind::kBinary;
  return PathKind::kText;
}

std::string describe(PathKind kind) {
  switch (kind) {
    case PathKind::kMissing: return "missing";
    case PathKind::kFolder: return "a folder";
    case PathKind::kGguf: return "a GGUF file";
    case PathKind::kSafetensors: return "a safetensors file (weights alone: give the folder that holds it and config.json)";
    case PathKind::kJson: return "a JSON file";
    case PathKind::kJsonl: return "a JSONL file (one JSON value per line, like training data)";
    case PathKind::kZip: return "a zip archive (a PyTorch .bin checkpoint? Loom reads safetensors and GGUF)";
    case PathKind::kEmpty: return "an empty file";
    case PathKind::kText: return "a text file";
    case PathKind::kBinary: return "a binary file of no kind Loom reads";
  }
  return "?";
}

absl::Status check_input_path(const std::string& path, const std::string& what, const std::string& expected) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("the ", what, " is empty (expected ", expected, ")"));
  std::error_code ec;
  if (fs::exists(path, ec)) return absl::OkStatus();
  if (looks_like_hub_id(path))
    return absl::NotFoundError(absl::StrCat(
        "the ", what, " ", path, " does not exist; it looks like a Hugging Face model id, but Loom reads local model ",
        "folders and .gguf files only and downloads nothing: fetch it first, e.g. `huggingface-cli download ", path,
        " --local-dir DIR`, and give DIR (tools/fetch_smollm2.sh fetches the demo model, SmolLM2-135M-Instruct, as a .gguf)"));
  return absl::NotFoundError(absl::StrCat("the ", what, " ", path, ": ", ec ? ec.message() : std::strerror(ENOENT),
                                          " (expected ", expected, ")"));
}

absl::Status wrong_kind(const std::string& path, PathKind kind, const std::string& expected) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": expected ", expected, ", but this is ", describe(kind),
                                                 kind == PathKind::kGguf ? " (name it with the .gguf extension)" : ""));
}

}  // namespace loom
