// What a new user meets first in `loom`: a mistyped flag or command answered with the closest one
// (as git and cargo do, only when it is close), the compute dtype's one rule (f32 on the CPU, bf16 on
// CUDA) in the help and in what a run reports, and --threads taken by every command.
#include <gtest/gtest.h>

#include "tests/e2e/cli.h"
#include "tests/e2e/train_dirs.h"
#include "tests/models/fixtures.h"

namespace loom::test {
namespace {

bool has(const RunResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

TEST(CliFlags, AMistypedFlagOrCommandGetsTheClosestSuggested) {
  RunResult r = run_loom("generate --modle x --prompt hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "unknown flag --modle (did you mean --model?)")) << r.output;
  r = run_loom("export --model x --out y.gguf --tpye f16");  // a swap of neighbours
  EXPECT_TRUE(has(r, "unknown flag --tpye (did you mean --type?)")) << r.output;
  r = run_loom("generate --model x --temprature 0");
  EXPECT_TRUE(has(r, "(did you mean --temperature?)")) << r.output;
  r = run_loom("generate --model x --theads 2");  // the global flag is a candidate too
  EXPECT_TRUE(has(r, "(did you mean --threads?)")) << r.output;
  // Nothing close: no suggestion.
  r = run_loom("generate --zzzzzzzz 1");
  EXPECT_TRUE(has(r, "unknown flag --zzzzzzzz")) << r.output;
  EXPECT_FALSE(has(r, "did you mean")) << r.output;
  r = run_loom("genrate --model x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r, "unknown command 'genrate' (did you mean 'generate'?)")) << r.output;
  r = run_loom("chta");
  EXPECT_TRUE(has(r, "(did you mean 'chat'?)")) << r.output;
  r = run_loom("frobnicate");
  EXPECT_TRUE(has(r, "unknown command 'frobnicate'")) << r.output;
  EXPECT_FALSE(has(r, "did you mean")) << r.output;
}

TEST(CliFlags, TheDefaultDtypeIsF32OnTheCpuAndBf16OnCuda) {
  for (const char* command : {"generate", "chat", "forward"}) {
    RunResult r = run_loom(std::string(command) + " --help");
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_TRUE(has(r, "--dtype VALUE\n      compute dtype: f32 or bf16 (default: f32 on cpu, bf16 on cuda)\n"))
        << command << ": " << r.output;
  }
  // A run says what it computed in: f32 without --dtype on the CPU, bf16 when asked.
  const std::string gen = "generate --model " + base_model() + " --prompt 'The loom' --max-new-tokens 3 --temperature 0";
  RunResult r = run_loom(gen);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "; f32 on cpu)")) << r.output;
  r = run_loom(gen + " --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "; bf16 on cpu)")) << r.output;
  r = run_loom(gen + " --dtype f16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "--dtype must be f32 or bf16, got 'f16'")) << r.output;
}

TEST(CliFlags, ThreadsIsTakenByEveryCommandAndChecked) {
  EXPECT_TRUE(has(run_loom("--help"), "--threads N"));
  EXPECT_TRUE(has(run_loom("merge --help"), "--threads N\n      CPU threads"));
  RunResult r = run_loom("--threads 1 demo --steps 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_loom("demo --steps 2 --threads=2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const std::string bad : {"0", "two", "-3"}) {
    r = run_loom("demo --steps 1 --threads " + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_TRUE(has(r, "--threads expects a thread count >= 1, got '" + bad + "'")) << r.output;
  }
}

// loom runs itself again with OMP_WAIT_POLICY=passive unless the user chose a policy
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT); `loom --version` shows what the process runs with.
TEST(CliFlags, OpenMpWaitPolicyIsPassiveUnlessTheUserChoseOne) {
  const std::string env = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT ";
  auto version = [&](const std::string& vars, const std::string& args = "--version") {
    const std::string cmd = env + vars + " " + LOOM_BINARY + " " + args + " 2>&1";
    RunResult r;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[512];
    size_t n;
    while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
    r.exit_code = p ? WEXITSTATUS(pclose(p)) : -1;
    return r;
  };
  RunResult r = version("");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(has(r, "OMP_WAIT_POLICY=passive\n")) << r.output;
  EXPECT_TRUE(has(version("OMP_WAIT_POLICY=active"), "OMP_WAIT_POLICY=active\n"));
  r = version("GOMP_SPINCOUNT=1000");
  EXPECT_TRUE(has(r, "OMP_WAIT_POLICY=(unset), GOMP_SPINCOUNT=1000\n")) << r.output;
  // Arguments and the rest of the environment go through the re-execution as they were.
  r = version("OMP_NUM_THREADS=3", "--threads 1 --version");
  EXPECT_TRUE(has(r, "OpenMP: 3 threads, OMP_WAIT_POLICY=passive")) << r.output;
}

}  // namespace
}  // namespace loom::test
