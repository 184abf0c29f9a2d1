// JSONL training data: one document per line, tokenized with a per-token loss mask. {"text"}: loss
// on every token (BOS from the tokenizer's post-processor, then EOS); {"prompt","completion"}: loss
// on the completion and EOS; {"messages"}, ShareGPT {"conversations"}, Alpaca {"instruction", ...}:
// train/data_formats.cpp. Other keys on a line are ignored.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "engine/io_error.h"
#include "engine/status_macros.h"
#include "train/data.h"
#include "train/data_formats.h"

namespace loom {
namespace {

using json = nlohmann::ordered_json;  // keys in the data's order (tool-call arguments are printed)

// Byte offset of the first invalid UTF-8 sequence in s (overlong forms, surrogates and code points
// above U+10FFFF included), or npos.
size_t find_invalid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp, min;
    if ((c >> 5) == 0x6) {
      n = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c >> 4) == 0xE) {
      n = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c >> 3) == 0x1E) {
      n = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (i + n > s.size()) return i;
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n;
  }
  return std::string::npos;
}

bool is_blank(const std::string& s) {
  for (char c : s) {
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return false;
  }
  return true;
}

absl::StatusOr<std::string> get_string(const json& obj, const char* key) {
  const json& v = obj[key];
  if (!v.is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a string, got ", v.type_name()));
  }
  return v.get<std::string>();
}

void append(Example* ex, const std::vector<int32_t>& ids, uint8_t target) {
  ex->ids.insert(ex->ids.end(), ids.begin(), ids.end());
  ex->target.insert(ex->target.end(), ids.size(), target);
}

void append_eos(Example* ex, const Tokenizer& tok) {
  if (const auto eos = tok.eos_id()) {
    ex->ids.push_back(*eos);
    ex->target.push_back(1);
  }
}

// One non-blank line as a JSON object (valid UTF-8, well-formed); the caller adds "<file>:<line>: ".
absl::StatusOr<json> parse_object(const std::string& line) {
  if (const size_t bad = find_invalid_utf8(line); bad != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("invalid UTF-8 at byte ", bad + 1));
  }
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    try {  // parse again only to get the parser's message
      j = json::parse(line);
    } catch (const json::exception& e) {  // out_of_range too: "number overflow parsing '1E400'"
      return absl::InvalidArgumentError(absl::StrCat("malformed JSON: ", e.what()));
    }
    return absl::InvalidArgumentError("malformed JSON");
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("expected a JSON object, got ", j.type_name()));
  }
  return j;
}

// Tokenizes one line's object; the caller adds "<file>:<line>: " to errors.
absl::StatusOr<Example> parse_line(const json& j, const Tokenizer& tok, const DataOptions& options, LineInfo* info) {
  const bool has_text = j.contains("text"), has_messages = j.contains("messages");
  const bool has_pc = j.contains("prompt") || j.contains("completion");
  const bool has_sharegpt = j.contains("conversations");
  const bool has_alpaca = j.contains("instruction") || j.contains("output");
  const int shapes = int(has_text) + int(has_messages) + int(has_pc) + int(has_sharegpt) + int(has_alpaca);
  if (shapes != 1) {
    std::string keys;
    for (const auto& [k, v] : j.items()) absl::StrAppend(&keys, keys.empty() ? "" : ", ", "\"", k, "\"");
    return absl::InvalidArgumentError(absl::StrCat(
        shapes == 0 ? "unknown shape" : "ambiguous shape (use only one)", ": expected {\"text\"}, {\"messages\": [...]}, "
        "{\"prompt\", \"completion\"}, ShareGPT {\"conversations\": [...]} or Alpaca {\"instruction\", \"input\", "
        "\"output\"}; the line has ", keys.empty() ? "no keys" : keys));
  }
  Example ex;
  if (has_text) {
    auto text = get_string(j, "text");
    if (!text.ok()) return text.status();
    append(&ex, tok.encode(*text, /*add_special_tokens=*/true), 1);
    append_eos(&ex, tok);
  } else if (has_messages || has_sharegpt || has_alpaca) {
    const LineShape shape = has_messages ? LineShape::kMessages : has_sharegpt ? LineShape::kShareGpt : LineShape::kAlpaca;
    auto r = example_from_line(shape, j, tok, options, info);
    if (!r.ok()) return r.status();
    ex = *std::move(r);
  } else {
    if (!j.contains("prompt") || !j.contains("completion")) {
      return absl::InvalidArgumentError("\"prompt\" and \"completion\" must both be present");
    }
    auto prompt = get_string(j, "prompt");
    if (!prompt.ok()) return prompt.status();
    auto completion = get_string(j, "completion");
    if (!completion.ok()) return completion.status();
    append(&ex, tok.encode(*prompt, /*add_special_tokens=*/true), 0);
    append(&ex, tok.encode(*completion, /*add_special_tokens=*/false), 1);
    append_eos(&ex, tok);
  }
  if (ex.ids.empty()) return absl::InvalidArgumentError("the document has no tokens");
  if (options.max_tokens > 0 && static_cast<int64_t>(ex.ids.size()) > options.max_tokens) {
    ex.ids.resize(options.max_tokens);
    ex.target.resize(options.max_tokens);
  }
  return ex;
}

// One JSONL line is one document: a line longer than this is refused (a file of one giant line, or of
// no text at all, must not be read whole into memory). 64 MiB is ~16M tokens, far past any context.
constexpr size_t kMaxLineBytes = size_t{64} << 20;

enum class LineRead { kLine, kEnd, kTooLong };
// std::getline with a bound, over 1 MiB blocks (memchr for the newline): a line of more than `max`
// bytes is reported as kTooLong, at once when the caller will stop there, else after skipping to its
// end (a file of one 10 GB line is not read to report that its first line is too long).
class LineReader {
 public:
  explicit LineReader(std::istream& f) : f_(f), buf_(size_t{1} << 20) {}
  LineRead next(std::string* line, size_t max, bool skip_overlong) {
    line->clear();
    bool any = false, too_long = false;
    for (;;) {
      if (pos_ == end_) {
        f_.read(buf_.data(), static_cast<std::streamsize>(buf_.size()));
        pos_ = 0;
        end_ = static_cast<size_t>(f_.gcount());
        if (end_ == 0) return !any ? LineRead::kEnd : too_long ? LineRead::kTooLong : LineRead::kLine;
      }
      any = true;
      const char* start = buf_.data() + pos_;
      const char* nl = static_cast<const char*>(std::memchr(start, '\n', end_ - pos_));
      const size_t n = nl ? static_cast<size_t>(nl - start) : end_ - pos_;
      if (!too_long && line->size() + n > max) {
        too_long = true;
        std::string().swap(*line);
        if (!skip_overlong) return LineRead::kTooLong;
      }
      if (!too_long) line->append(start, n);
      pos_ += n;
      if (nl) {
        ++pos_;
        return too_long ? LineRead::kTooLong : LineRead::kLine;
      }
    }
  }

 private:
  std::istream& f_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
};

}  // namespace

uint64_t default_max_data_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return uint64_t{1} << 40;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2;
}

absl::StatusOr<std::vector<Example>> load_jsonl(const std::string& path, const Tokenizer& tokenizer,
                                                const DataOptions& options, DataStats* stats) {
  DataStats local;
  DataStats& st = stats ? *stats : local;
  st = DataStats{};
  std::vector<Example> out;
  auto one = [&](const json& j, int64_t lineno) -> absl::Status {
    LineInfo info;
    auto ex = parse_line(j, tokenizer, options, &info);
    if (!ex.ok()) {  // a template that cannot be used is said once, not per skipped line
      if (options.skip_bad_lines && info.template_failed && st.template_skipped++ == 0)
        st.template_error = absl::StrCat(path, ":", lineno, ": ", ex.status().message());
      return ex.status();
    }
    ++st.examples;
    st.conversations += info.conversation;
    st.tokens += static_cast<int64_t>(ex->ids.size());
    for (uint8_t t : ex->target) st.target_tokens += t;
    out.push_back(*std::move(ex));
    return absl::OkStatus();
  };
  LOOM_RETURN_IF_ERROR(for_each_jsonl_object(path, options.skip_bad_lines, options.max_file_bytes, one, &st.lines, &st.skipped));
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no training examples (", st.lines, " non-blank lines, ",
                                                   st.skipped, " skipped as bad)"));
  }
  return out;
}

absl::Status for_each_jsonl_object(const std::string& path, bool skip_bad_lines, int64_t max_file_bytes,
                                   const JsonlObjectFn& fn, int64_t* lines, int64_t* skipped) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a folder (Is a directory); a JSONL file is needed"));
  std::ifstream f(path, std::ios::binary);
  if (!f || is_directory_path(path))
    return absl::NotFoundError(absl::StrCat(path, ": cannot open the data file: ", open_error_reason(path)));
  const uint64_t limit = max_file_bytes > 0 ? static_cast<uint64_t>(max_file_bytes) : default_max_data_bytes();
  if (const uintmax_t size = std::filesystem::file_size(path, ec); !ec && size > limit)
    return absl::ResourceExhaustedError(absl::StrCat(
        path, ": ", size, " bytes is more than the ", limit,
        "-byte limit on training data held in memory (half the physical memory); split it into smaller files"));
  std::string line;
  int64_t lineno = 0;
  LineReader reader(f);
  for (;;) {
    const LineRead r = reader.next(&line, kMaxLineBytes, skip_bad_lines);
    if (r == LineRead::kEnd) break;
    ++lineno;
    absl::Status s;
    if (r == LineRead::kTooLong) {
      s = absl::InvalidArgumentError(
          absl::StrCat("the line is longer than ", kMaxLineBytes, " bytes (one document per line; is this a JSONL file?)"));
    } else {
      if (is_blank(line)) continue;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      auto j = parse_object(line);
      s = j.ok() ? fn(*j, lineno) : j.status();
    }
    ++*lines;
    if (s.ok()) continue;
    if (!skip_bad_lines) return absl::Status(s.code(), absl::StrCat(path, ":", lineno, ": ", s.message()));
    ++*skipped;
  }
  if (f.bad()) return absl::DataLossError(absl::StrCat(path, ":", lineno, ": read error"));
  return absl::OkStatus();
}

}  // namespace loom
