// Runs the `loom` binary for end-to-end tests and captures its exit code and output.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace loom::test {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command and captures its stdout and exit code.
inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline RunResult run_loom(const std::string& args) { return run_command(std::string(LOOM_BINARY) + " " + args + " 2>&1"); }

}  // namespace loom::test
