// `loom`: the command-line entry point; dispatches to the subcommands in tools/cmd_*.cpp.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* help;
};

const Command kCommands[] = {
    {"demo", loom::cli::run_demo, "train a small Llama-style model on a built-in pattern and print the loss"},
    {"forward", loom::cli::run_forward, "logits, loss and LoRA gradients of a Hugging Face model on given token ids"},
    {"merge", loom::cli::run_merge, "fold a PEFT LoRA adapter into its base model; write a bf16 checkpoint"},
    {"train", loom::cli::run_train, "fine-tune a Hugging Face model on JSONL data (LoRA or full)"},
    {"generate", loom::cli::run_generate, "sample a continuation of a prompt (KV cache)"},
    {"init", loom::cli::run_init, "write a freshly initialised model from a config.json"},
    {"tokenize", loom::cli::run_tokenize, "print the token ids of text or JSONL records under a tokenizer.json"},
    {"convert", loom::cli::run_convert, "write a llama.cpp .gguf model as a Hugging Face folder (f32 or bf16)"},
    {"quantize", loom::cli::run_quantize, "write a model as a bitsandbytes NF4 4-bit checkpoint (as transformers saves it)"},
    {"bench-cpu", loom::cli::run_bench_cpu, "time the CPU LoRA training step; GFLOP/s beside Eigen's sgemm"},
    {"export", loom::cli::run_export, "write a model (+ LoRA adapter, merged) as a llama.cpp .gguf file"},
};

void print_help(std::FILE* out) {
  std::fprintf(out, "usage: loom <command> [flags]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.help);
  std::fprintf(out, "\n`loom <command> --help` (or `loom help <command>`) lists a command's flags; "
                    "`loom --version` prints the version.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {  // no command: the usage is the error message
    print_help(stderr);
    return 2;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h" || (first == "help" && argc == 2)) {  // asked for: stdout, success
    print_help(stdout);
    return 0;
  }
  if (first == "--version" || first == "version") {
    std::printf("loom %s\n", LOOM_VERSION);
    return 0;
  }
  std::string name = first;
  std::vector<std::string> args(argv + 2, argv + argc);
  if (first == "help") {  // loom help <command> = loom <command> --help
    name = argv[2];
    args = {"--help"};
  }
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
  std::fprintf(stderr, "loom: unknown command '%s'\n\n", name.c_str());
  print_help(stderr);
  return 2;
}
