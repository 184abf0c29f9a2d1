// Why a file could not be opened, in the operating system's words ("No such file or directory",
// "Permission denied", "Is a directory"), for "cannot open" messages. Call right after the failed
// open: errno is read here. (An ifstream opens a directory without complaint; that is checked.)
#pragma once
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace loom {

inline std::string open_error_reason(const std::string& path) {
  const int err = errno;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "Is a directory";
  return std::strerror(err != 0 ? err : ENOENT);
}

// True when path names a directory (which an ifstream would "open").
inline bool is_directory_path(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

// True when `path` is the folder `dir` or lies below it, after resolving "..", "." and the symbolic
// links that exist (for "never write an output over an input" checks). False when either is empty.
inline bool path_is_within(const std::string& path, const std::string& dir) {
  if (path.empty() || dir.empty()) return false;
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  if (ec) return false;
  const std::filesystem::path d = std::filesystem::weakly_canonical(dir, ec);
  if (ec) return false;
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty()) continue;  // a trailing separator
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
}

}  // namespace loom
