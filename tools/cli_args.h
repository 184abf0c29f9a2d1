// Minimal flag parsing for `loom` subcommands: `--name value`, `--name=value` and boolean
// `--name`. Unknown flags, missing values and malformed numbers are errors naming the flag.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::cli {

struct FlagSpec {
  std::string name;  // without dashes
  bool is_bool = false;
  std::string help;
  std::string default_value;
};

class Args {
 public:
  static absl::StatusOr<Args> parse(const std::vector<std::string>& argv, const std::vector<FlagSpec>& specs);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name) const;
  absl::StatusOr<int64_t> integer(const std::string& name) const;
  absl::StatusOr<double> number(const std::string& name) const;
  bool flag(const std::string& name) const { return has(name); }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> defaults_;
};

std::string usage(const std::string& command, const std::vector<FlagSpec>& specs);

}  // namespace loom::cli
