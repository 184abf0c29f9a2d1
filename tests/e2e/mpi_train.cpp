// `mpirun -np N loom train --dist ddp|zero2` end to end on CPU processes (label mpi): the same
// per-step losses and final adapter as one process with the same global batch, for DDP and ZeRO-2
// on 1, 2 and 3 ranks (3 does not divide the shards evenly), with gradient accumulation and LoRA
// dropout; the same with --offload-optimizer bit for bit; a ZeRO-2 checkpoint from 2 ranks resumes
// on 3 and on 1 with the same losses; a killed or a hung rank makes the job exit non-zero within the
// deadline; differing configs are refused on every rank; --eval-data gives the one-process eval loss.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/tensor_io.h"
#include "tests/e2e/train_dirs.h"

namespace loom::test {
namespace {
namespace fs = std::filesystem;

const std::string kData = kSrc + "/examples/demo/weaving.jsonl";
const std::string kMpi = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun --oversubscribe ";

// Tolerance, f32: ranks add their partial gradient sums in another order than one process adds its
// rows, about 1 ulp per step (observed 6e-8 relative); over 8 AdamW steps that stays far below 1e-5.
constexpr double kLossRel = 1e-5, kWeightAbs = 1e-5;

std::string args(const std::string& out, int steps, int batch) {
  return "train --model " + base_model() + " --data " + kData + " --out " + out + " --seq-len 64 --batch-size " +
         std::to_string(batch) + " --grad-accum 2 --max-steps " + std::to_string(steps) +
         " --lr 5e-3 --schedule linear --warmup 2 --lora-r 8 --lora-alpha 16 --lora-dropout 0.1" +
         " --lora-targets q_proj,v_proj,down_proj,lm_head --dtype f32 --quiet --dist-timeout 60";
}

// A shell command's exit code and output (stdout and stderr).
RunResult run_sh(const std::string& cmd) { return run_command(cmd + " 2>&1"); }

RunResult run_mpi(int np, const std::string& a) {
  return run_sh(kMpi + "-np " + std::to_string(np) + " " + LOOM_BINARY + " " + a);
}

void expect_losses_near(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], kLossRel * std::abs(want[i])) << what << " step " << i + 1;
}

void expect_adapters_near(const std::string& a, const std::string& b) {
  auto x = load_tensors(a + "/adapter_model.safetensors"), y = load_tensors(b + "/adapter_model.safetensors");
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ(x->size(), y->size());
  for (const auto& [name, t] : *x) {
    const auto u = t.to_floats(), v = y->at(name).to_floats();
    ASSERT_EQ(u.size(), v.size()) << name;
    for (size_t i = 0; i < u.size(); ++i) ASSERT_NEAR(u[i], v[i], kWeightAbs) << name << " " << i;
  }
}

TEST(MpiTrain, DdpAndZero2MatchOneProcessWithTheSameGlobalBatch) {
  const std::string single = fresh_dir("dist_single");
  RunResult r = run_sh("OMP_NUM_THREADS=1 " + std::string(LOOM_BINARY) + " " + args(single, 6, 6));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = metric_losses(single);
  // A world of one through the distributed path is the single process, bit for bit.
  const std::string one = fresh_dir("dist_ddp1");
  r = run_mpi(1, args(one, 6, 6) + " --dist ddp");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metric_losses(one), want);
  expect_adapters_near(one, single);
  struct Run {
    int np, batch;
    const char* mode;
  };
  for (Run run : {Run{2, 3, "ddp"}, Run{3, 2, "ddp"}, Run{2, 3, "zero2"}, Run{3, 2, "zero2"}}) {
    const std::string what = std::string(run.mode) + " -np " + std::to_string(run.np);
    const std::string out = fresh_dir(std::string("dist_") + run.mode + std::to_string(run.np));
    r = run_mpi(run.np, args(out, 6, run.batch) + " --dist " + run.mode);
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
    expect_losses_near(metric_losses(out), want, what);
    expect_adapters_near(out, single);
    EXPECT_TRUE(fs::exists(out + "/loss.svg"));
    if (std::string(run.mode) == "zero2") {
      for (int k = 1; k < run.np; ++k)
        EXPECT_TRUE(fs::exists(out + "/checkpoint-6/optimizer-rank" + std::to_string(k) + ".safetensors")) << what;
    }
  }
}

// QLoRA and the checkpointing modes through the distributed path: every rank quantises the same
// NF4 base, recomputes (or offloads) its layers' inputs, and the losses and adapter equal one
// process's with the same global batch. ZeRO-2's start line reports the state per rank: on two
// ranks half of AdamW's 8 bytes per parameter plus half of the f32 master shard ZeRO-2 keeps
// (4 bytes; with f32 weights DDP needs none, so the unsharded figure is 8P): 6P = 0.75 x 8P.
TEST(MpiTrain, QloraAndCheckpointingModesMatchOneProcess) {
  for (const char* mode : {"recompute", "offload"}) {
    const std::string extra = std::string(" --qlora --checkpointing ") + mode, what = std::string("--qlora ") + mode;
    const std::string single = fresh_dir(std::string("dist_q1_") + mode), two = fresh_dir(std::string("dist_q2_") + mode);
    RunResult r = run_sh("OMP_NUM_THREADS=1 " + std::string(LOOM_BINARY) + " " + args(single, 4, 6) + extra);
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
    // Not --quiet here: the start line is what is checked.
    std::string a = args(two, 4, 3) + extra + " --dist zero2";
    a = a.substr(0, a.find(" --quiet")) + a.substr(a.find(" --quiet") + 8);
    r = run_mpi(2, a);
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
    expect_losses_near(metric_losses(two), metric_losses(single), what);
    expect_adapters_near(two, single);
    double per_rank = 0, unsharded = 0;
    const size_t at = r.output.find("optimizer state + f32 masters ");
    ASSERT_NE(at, std::string::npos) << r.output;
    ASSERT_EQ(std::sscanf(r.output.c_str() + at, "optimizer state + f32 masters %lf MiB per rank (%lf MiB unsharded)",
                          &per_rank, &unsharded), 2)
        << r.output.substr(at, 120);
    EXPECT_GT(unsharded, 0);
    EXPECT_NEAR(per_rank, 0.75 * unsharded, unsharded * 0.01) << r.output.substr(at, 120);
  }
}

TEST(MpiTrain, FullFineTuningZero2With8bitAdamWMatchesOneProcess) {
  const std::string base = "train --model " + base_model() + " --data " + kData +
                           " --seq-len 64 --grad-accum 1 --max-steps 3 --lr 1e-4 --full --optim adamw8bit --dtype f32 --quiet";
  const std::string single = fresh_dir("dist_full1"), three = fresh_dir("dist_full3");
  RunResult r = run_sh("OMP_NUM_THREADS=1 " + std::string(LOOM_BINARY) + " " + base + " --out " + single + " --batch-size 6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_mpi(3, base + " --out " + three + " --batch-size 2 --dist zero2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 8-bit state: a last-bit difference in a summed gradient can move a code by one step, which
  // changes that element's update by about 1/127 of its moment: 1e-4 relative on the loss.
  const auto a = metric_losses(single), b = metric_losses(three);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::abs(a[i])) << "step " << i + 1;
}

TEST(MpiTrain, Zero2CheckpointFromTwoRanksResumesOnThreeAndOne) {
  const std::string whole = fresh_dir("dist_whole"), split = fresh_dir("dist_split");
  RunResult r = run_mpi(1, args(whole, 8, 6) + " --dist zero2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_mpi(2, args(split, 8, 3) + " --dist zero2 --stop-after 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(split + "/checkpoint-4/optimizer-rank1.safetensors"));
  const std::string split1 = fresh_dir("dist_split1");
  fs::copy(split, split1, fs::copy_options::recursive);
  r = run_mpi(3, args(split, 8, 2) + " --dist zero2 --resume " + split);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_losses_near(metric_losses(split), metric_losses(whole), "2 ranks then 3");
  r = run_mpi(1, args(split1, 8, 6) + " --dist zero2 --resume " + split1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_losses_near(metric_losses(split1), metric_losses(whole), "2 ranks then 1");
  // Without --dist zero2 (a resumed run inherits its --dist unless told otherwise) the shards cannot
  // be read: a clear refusal.
  r = run_loom(args(split1, 8, 6) + " --dist '' --resume " + split + "/checkpoint-4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--dist zero2"), std::string::npos) << r.output;
}

// --offload-optimizer: every rank keeps its masters and state (ZeRO-2: only its shard) on the host
// and steps them on the CPU with the same kernels, so the runs equal the device optimizer's bit for
// bit, and a stopped offloaded ZeRO-2 run resumes exactly.
TEST(MpiTrain, OffloadedOptimizerEqualsTheDeviceOneOnEveryRank) {
  struct Run {
    int np, batch;
    const char* mode;
  };
  for (Run run : {Run{3, 2, "zero2"}, Run{2, 3, "ddp"}}) {
    const std::string what = std::string(run.mode) + " -np " + std::to_string(run.np);
    const std::string plain = fresh_dir(std::string("off_plain_") + run.mode), off = fresh_dir(std::string("off_") + run.mode);
    RunResult r = run_mpi(run.np, args(plain, 6, run.batch) + " --dist " + run.mode);
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
    r = run_mpi(run.np, args(off, 6, run.batch) + " --dist " + run.mode + " --offload-optimizer");
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
    EXPECT_EQ(metric_losses(off), metric_losses(plain)) << what;
    auto x = load_tensors(plain + "/adapter_model.safetensors"), y = load_tensors(off + "/adapter_model.safetensors");
    ASSERT_TRUE(x.ok() && y.ok());
    for (const auto& [name, t] : *x) EXPECT_EQ(t.to_floats(), y->at(name).to_floats()) << what << " " << name;
  }
  const std::string whole = fresh_dir("off_whole"), split = fresh_dir("off_split");
  RunResult r = run_mpi(2, args(whole, 6, 3) + " --dist zero2 --offload-optimizer");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_mpi(2, args(split, 6, 3) + " --dist zero2 --offload-optimizer --stop-after 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_mpi(2, args(split, 6, 3) + " --dist zero2 --offload-optimizer --resume " + split);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metric_losses(split), metric_losses(whole));
}

// Every rank evaluates its rows of each global batch of --eval-data and the sums are global: the
// same eval_loss as one process.
TEST(MpiTrain, EvalLossIsTheOneProcessEvalLoss) {
  const std::string eval = fresh_dir("dist_eval_data") + ".jsonl";
  {
    std::ifstream in(kData);
    std::ofstream o(eval);
    std::string line;
    for (int i = 0; i < 7 && std::getline(in, line); ++i) o << line << "\n";  // 7 documents: uneven over 2 ranks
  }
  const std::string single = fresh_dir("dist_eval_single");
  RunResult r = run_sh("OMP_NUM_THREADS=1 " + std::string(LOOM_BINARY) + " " + args(single, 4, 6) + " --eval-data " + eval +
                       " --eval-every 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = metric_values(single, "eval_loss");
  ASSERT_EQ(want.size(), 2u);
  for (const char* mode : {"ddp", "zero2"}) {
    const std::string out = fresh_dir(std::string("dist_eval_") + mode);
    r = run_mpi(2, args(out, 4, 3) + " --dist " + mode + " --eval-data " + eval + " --eval-every 2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_losses_near(metric_values(out, "eval_loss"), want, mode);
  }
}

TEST(MpiTrain, MismatchedConfigsAreRefusedOnEveryRank) {
  const std::string out = fresh_dir("dist_mismatch");
  const std::string a = args(out, 4, 3) + " --dist ddp";
  RunResult r = run_sh(kMpi + "-np 1 " + LOOM_BINARY + " " + a + " --seed 1 : -np 1 " +
                         LOOM_BINARY + " " + a + " --seed 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("rank 0 has --seed = '1'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 has --seed = '2'"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl"));
}

// Starts `mpirun -np 2` training for long in the background; returns mpirun's pid.
pid_t start_long_run(const std::string& out, const std::string& log, int timeout_s) {
  const std::string cmd = kMpi + "-np 2 -x LOOM_TEST_JOB=" + out + " " + LOOM_BINARY + " " + args(out, 100000, 3) + " --dist ddp --dist-timeout " +
                          std::to_string(timeout_s) + " > " + log + " 2>&1";
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", ("exec env " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The pid of rank `rank` of the job whose LOOM_TEST_JOB is `job` (a variable mpirun -x exports).
pid_t find_rank(const std::string& job, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string n = e.path().filename().string();
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream env(e.path() / "environ");
    std::string all((std::istreambuf_iterator<char>(env)), {});
    if (all.find(std::string("LOOM_TEST_JOB=") + job + '\0') != std::string::npos &&
        all.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos)
      return std::stoi(n);
  }
  return -1;
}

// Waits for rank 0 to have trained a step, applies `sig` to rank 1, and returns (exit status,
// seconds from the signal to mpirun's exit, log).
std::tuple<int, double, std::string> interrupt_rank1(const std::string& name, int sig, int timeout_s) {
  const std::string out = fresh_dir(name), log = out + ".log";
  const pid_t mpirun = start_long_run(out, log, timeout_s);
  const auto t_start = std::chrono::steady_clock::now();
  pid_t victim = -1;
  while (std::chrono::steady_clock::now() - t_start < std::chrono::seconds(120)) {
    std::ifstream m(out + "/metrics.jsonl");
    std::string line;
    if (std::getline(m, line) && (victim = find_rank(out, 1)) > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(victim, 0) << "rank 1 of the run was not found";
  if (victim > 0) kill(victim, sig);
  const auto t_sig = std::chrono::steady_clock::now();
  int status = 0;
  for (;;) {
    if (waitpid(mpirun, &status, WNOHANG) == mpirun) break;
    if (std::chrono::steady_clock::now() - t_sig > std::chrono::seconds(timeout_s + 60)) {
      kill(-mpirun, SIGKILL);  // the job hangs: fail, but do not hang the test
      waitpid(mpirun, &status, 0);
      if (victim > 0) kill(victim, SIGKILL);
      ADD_FAILURE() << "the job did not end within " << timeout_s + 60 << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (sig == SIGSTOP && victim > 0) kill(victim, SIGKILL);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_sig).count();
  std::ifstream f(log);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return {code, waited, text};
}

TEST(MpiTrain, AHungRankMakesTheOthersExitWithinTheDeadline) {
  // A stopped process neither answers nor dies: only the deadline can end the job. Rank 0 waits in
  // a collective, passes the 10 s deadline, names itself and aborts the job (the slack covers the
  // launcher's teardown on a loaded 2-core machine).
  auto [code, waited, log] = interrupt_rank1("dist_hung", SIGSTOP, 10);
  EXPECT_NE(code, 0) << log;
  EXPECT_GE(waited, 4) << "ended well before the deadline: something else stopped the job\n" << log;
  EXPECT_LT(waited, 10 + 20) << log;
  EXPECT_NE(log.find("rank 0 of 2"), std::string::npos) << log;
  EXPECT_NE(log.find("deadline"), std::string::npos) << log;
}

TEST(MpiTrain, AKilledRankMakesTheOthersExitWithinTheDeadline) {
  // Open MPI's launcher itself ends the job when a rank dies; the deadline is the fallback.
  auto [code, waited, log] = interrupt_rank1("dist_killed", SIGKILL, 10);
  EXPECT_NE(code, 0) << log;
  EXPECT_LT(waited, 10 + 20) << log;
}

}  // namespace
}  // namespace loom::test
