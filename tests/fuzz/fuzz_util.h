// Shared by the libFuzzer targets: a per-process scratch folder (on tmpfs when there is one) for the
// readers that take a path, and the fixtures the targets load once.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace loom::fuzz {

inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path base = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("loom_fuzz_" + std::to_string(getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  static const bool cleanup = [] {  // removed at exit (libFuzzer exits through exit())
    return std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    }) == 0;
  }();
  (void)cleanup;
  return dir;
}

// A sub-folder of the scratch folder, created once.
inline std::string scratch_subdir(const std::string& name) {
  std::string d = scratch_dir() + "/" + name;
  std::filesystem::create_directories(d);
  return d;
}

inline void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

inline std::string fixture(const std::string& rel) { return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/" + rel; }

// A property the reader promised and broke: a crash the fuzzer reports with the input.
#define LOOM_FUZZ_CHECK(cond)                                                         \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

}  // namespace loom::fuzz
