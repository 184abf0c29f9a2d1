// The subcommands of `loom`, each `int run_<name>(argv after the subcommand)` returning an exit code.
#pragma once
#include <string>
#include <vector>

namespace loom::cli {
int run_demo(const std::vector<std::string>& args);
int run_forward(const std::vector<std::string>& args);
int run_merge(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
int run_generate(const std::vector<std::string>& args);
int run_chat(const std::vector<std::string>& args);
int run_init(const std::vector<std::string>& args);
int run_tokenize(const std::vector<std::string>& args);
int run_convert(const std::vector<std::string>& args);
int run_quantize(const std::vector<std::string>& args);
int run_export(const std::vector<std::string>& args);
int run_bench_cpu(const std::vector<std::string>& args);
int run_doctor(const std::vector<std::string>& args);
}  // namespace loom::cli
