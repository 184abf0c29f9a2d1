// Minimal flag parsing for `loom` subcommands: `--name value`, `--name=value` and boolean
// `--name`. Unknown flags, missing values and malformed numbers are errors naming the flag. A flag
// given again overrides its earlier value (the last one wins, as scripts that append overrides to a
// base command expect).
#pragma once
#include <map>
#include <set>
#include <string>
#include <utility>
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

// Outputs never go over inputs. `out` (the value of flag `out_flag`) is refused when it is the same
// path as one of `inputs` ({flag, path}; empty paths skipped) or, with `inside`, lies inside one of
// those folders; the error names both flags.
absl::Status check_not_over_inputs(const std::string& out_flag, const std::string& out,
                                   const std::vector<std::pair<std::string, std::string>>& inputs, bool inside);
// A folder a command writes a whole model into: refused when it already holds a model's weights
// (model.safetensors or model.safetensors.index.json), which the new files would replace or be
// mixed with (a stale index would even be loaded instead).
absl::Status check_model_out(const std::string& out_flag, const std::string& out);

}  // namespace loom::cli
