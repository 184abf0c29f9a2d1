// Flag parsing for `loom` subcommands (see cli_args.h).
#include "tools/cli_args.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/io_error.h"
#include "engine/precision.h"

namespace loom::cli {

absl::StatusOr<Args> Args::parse(const std::vector<std::string>& argv, const std::vector<FlagSpec>& specs) {
  Args a;
  static const FlagSpec kThreads{"threads", false, kThreadsHelp, ""};
  std::map<std::string, const FlagSpec*> by_name = {{"threads", &kThreads}};
  for (const auto& s : specs) {
    by_name[s.name] = &s;
    if (!s.default_value.empty()) a.defaults_[s.name] = s.default_value;
  }
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i] == "-h" ? std::string("--help") : argv[i];
    if (arg.rfind("--", 0) != 0)
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "' (flags start with --)"));
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::vector<std::string> known;
      for (const auto& [n, spec] : by_name) known.push_back(n);
      const std::string near = closest_match(name, known);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, near.empty() ? "" : absl::StrCat(" (did you mean --", near, "?)")));
    }
    if (it->second->is_bool) {
      if (inline_value && value != "true" && value != "false")
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value or true/false, got '", value, "'"));
      if (!inline_value || value == "true") a.values_[name] = "true";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    a.values_[name] = value;
  }
  if (a.has("threads")) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(a.str("threads"), &n) || n < 1 || n > 4096)
      return absl::InvalidArgumentError(absl::StrCat("--threads expects a thread count >= 1, got '", a.str("threads"), "'"));
    omp_set_num_threads(static_cast<int>(n));
  }
  return a;
}

DType default_dtype(const Device& device) { return default_model_dtype(device); }

absl::StatusOr<DType> dtype_flag(const Args& args, const Device& device, const std::string& flag) {
  if (!args.has(flag)) return default_dtype(device);
  const std::string v = args.str(flag);
  if (v == "f32") return DType::f32;
  if (v == "bf16") return DType::bf16;
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be f32 or bf16, got '", v, "'"));
}

std::string Args::str(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = defaults_.find(name); it != defaults_.end()) return it->second;
  return "";
}

absl::StatusOr<int64_t> Args::integer(const std::string& name) const {
  int64_t v = 0;
  const std::string s = str(name);
  if (!absl::SimpleAtoi(s, &v)) return absl::InvalidArgumentError(absl::StrCat("--", name, " expects an integer, got '", s, "'"));
  return v;
}

absl::StatusOr<double> Args::number(const std::string& name) const {
  double v = 0;
  const std::string s = str(name);
  if (!absl::SimpleAtod(s, &v)) return absl::InvalidArgumentError(absl::StrCat("--", name, " expects a number, got '", s, "'"));
  // inf and nan parse, and would train to a NaN loss or sample garbage without a word.
  if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat("--", name, " expects a finite number, got '", s, "'"));
  return v;
}

absl::Status check_not_over_inputs(const std::string& out_flag, const std::string& out,
                                   const std::vector<std::pair<std::string, std::string>>& inputs, bool inside) {
  for (const auto& [flag, in] : inputs) {
    if (in.empty()) continue;
    const bool same = path_is_within(out, in) && path_is_within(in, out);
    if (same || (inside && path_is_within(out, in)))
      return absl::InvalidArgumentError(absl::StrCat(out_flag, " ", out, same ? " is " : " lies inside ", flag, " ", in,
                                                     ": the output would be written over an input"));
  }
  return absl::OkStatus();
}

std::string usage(const std::string& command, const std::vector<FlagSpec>& specs) {
  std::string out = absl::StrCat("usage: loom ", command, " [flags]\n");
  for (const auto& s : specs) {
    absl::StrAppend(&out, "  --", s.name, s.is_bool ? "" : " VALUE", "\n      ", s.help);
    if (!s.default_value.empty()) absl::StrAppend(&out, " (default ", s.default_value, ")");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "  --threads N\n      ", kThreadsHelp, "\n");
  return out;
}

}  // namespace loom::cli
