// `loom`: the command-line entry point; dispatches to the subcommands in tools/cmd_*.cpp.
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* help;
};

const Command kCommands[] = {
    {"doctor", loom::cli::run_doctor, "check this machine: build, CPU, GPUs, NCCL, MPI, memory, disk, and a self-test"},
    {"demo", loom::cli::run_demo, "train a small Llama-style model on a built-in pattern and print the loss"},
    {"forward", loom::cli::run_forward, "logits, loss and LoRA gradients of a model on given token ids"},
    {"merge", loom::cli::run_merge, "fold a PEFT LoRA adapter into its base model; write a bf16 Hugging Face folder"},
    {"train", loom::cli::run_train, "fine-tune a Hugging Face model on JSONL data (LoRA or full)"},
    {"generate", loom::cli::run_generate, "continue a prompt or answer one chat message (KV cache)"},
    {"chat", loom::cli::run_chat, "a conversation in the terminal with the model's chat template"},
    {"init", loom::cli::run_init, "write a freshly initialised model from a config.json"},
    {"tokenize", loom::cli::run_tokenize, "print the token ids of text or JSONL records under a tokenizer.json"},
    {"convert", loom::cli::run_convert, "write a llama.cpp .gguf model as a Hugging Face folder (f32 or bf16)"},
    {"quantize", loom::cli::run_quantize, "write a model as a bitsandbytes NF4 4-bit checkpoint (as transformers saves it)"},
    {"bench-cpu", loom::cli::run_bench_cpu, "time the CPU LoRA training step; GFLOP/s beside Eigen's sgemm"},
    {"export", loom::cli::run_export, "write a model (+ LoRA adapter, merged) as a llama.cpp .gguf file"},
};

void print_help(std::FILE* out) {
  std::fprintf(out, "usage: loom <command> [flags]\n       loom --threads N <command> [flags]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.help);
  std::fprintf(out,
               "\n`loom <command> --help` (or `loom help <command>`) lists a command's flags; "
               "`loom --version` prints the version.\n"
               "\nModels are Hugging Face folders or llama.cpp .gguf files. On the CPU, Loom computes in f32 "
               "(--dtype bf16 to ask for bf16); on CUDA, in bf16.\n"
               "Threads: --threads N (any command) or OMP_NUM_THREADS; the default is every core. On a machine "
               "shared with other work, give fewer (the cores left free): OpenMP threads that wait for a busy "
               "core slow every step.\n"
               "Commands that write files refuse an existing output unless given --overwrite.\n");
}

// libgomp reads OMP_WAIT_POLICY once, in its constructor before main: by default its idle threads
// spin for a while before sleeping, which on a machine shared with other processes takes the cores
// the working threads need (generation 20x slower beside a compile). Unless the user chose a policy
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT), loom runs itself again, once, with OMP_WAIT_POLICY=passive:
// the same process (pid, arguments, environment, open files; so under mpirun too), the policy now
// set, so the second start does not re-execute. Where /proc/self/exe cannot be run, loom goes on as
// it is.
void reexec_with_passive_omp_waits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OMP_WAIT_POLICY");  // exec failed: this process keeps libgomp's default, say so honestly
}

}  // namespace

int main(int argc, char** argv) {
  reexec_with_passive_omp_waits(argv);
  std::vector<std::string> all(argv + 1, argv + argc);
  // Global flags before the command (`loom --threads 4 chat ...`) go to the command, which applies them.
  std::vector<std::string> global;
  while (!all.empty() && (all[0] == "--threads" || all[0].rfind("--threads=", 0) == 0)) {
    global.push_back(all[0]);
    all.erase(all.begin());
    if (global.back() == "--threads" && !all.empty()) {
      global.push_back(all[0]);
      all.erase(all.begin());
    }
  }
  if (all.empty()) {  // no command: the usage is the error message
    print_help(stderr);
    return 2;
  }
  const std::string first = all[0];
  if (first == "--help" || first == "-h" || (first == "help" && all.size() == 1)) {  // asked for: stdout, success
    print_help(stdout);
    return 0;
  }
  if (first == "--version" || first == "version") {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    std::printf("loom %s\nOpenMP: %d threads, OMP_WAIT_POLICY=%s%s%s\n", LOOM_VERSION, omp_get_max_threads(),
                policy ? policy : "(unset)", spin ? ", GOMP_SPINCOUNT=" : "", spin ? spin : "");
    return 0;
  }
  std::string name = first;
  std::vector<std::string> args(all.begin() + 1, all.end());
  if (first == "help") {  // loom help <command> = loom <command> --help
    name = all[1];
    args = {"--help"};
  }
  args.insert(args.begin(), global.begin(), global.end());
  for (const auto& c : kCommands) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const loom::OutOfMemoryError& e) {  // a limit the user can act on, not a bug
      std::fprintf(stderr, "loom %s: %s\n", c.name, e.what());
      return 1;
    } catch (const std::exception& e) {  // misuse inside the engine: report, never abort
      std::fprintf(stderr, "loom %s: internal error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::vector<std::string> names;
  for (const auto& c : kCommands) names.push_back(c.name);
  const std::string near = loom::closest_match(name, names);
  std::fprintf(stderr, "loom: unknown command '%s'%s\n\n", name.c_str(),
               near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str());
  print_help(stderr);
  return 2;
}
