// loom::Error, thrown on misuse of an op or kernel (shape/dtype mismatch, broken precondition), and
// the check macros every CUDA/cuBLAS call goes through. User-input errors use absl::Status instead.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Device memory ran out: not a bug but a limit the user can act on (a smaller batch or sequence);
// the message says what was being allocated, what is held, and what to try.
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& what) : Error(what) {}
};

namespace detail {
[[noreturn]] inline void fail(const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << msg << " (" << file << ":" << line << ")";
  throw Error(os.str());
}
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail
}  // namespace loom

// LOOM_CHECK(cond, parts...): throws loom::Error with the streamed parts when cond is false.
#define LOOM_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond)) ::loom::detail::fail(__FILE__, __LINE__, ::loom::detail::cat(__VA_ARGS__)); \
  } while (0)
