// Minimal flag parsing for `loom` subcommands: `--name value`, `--name=value` and boolean
// `--name`. Unknown flags (with the closest known one suggested), missing values and malformed
// numbers are errors naming the flag. A flag given again overrides its earlier value (the last one
// wins, as scripts that append overrides to a base command expect).
#pragma once
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "text/closest_match.h"
#include "engine/device.h"
#include "engine/dtype.h"

namespace loom::cli {

struct FlagSpec {
  std::string name;  // without dashes
  bool is_bool = false;
  std::string help;
  std::string default_value;
};

// Flags every command takes besides its own (Args::parse accepts and applies them; usage() lists them).
// --threads N: the OpenMP thread count for this run (omp_set_num_threads).
inline constexpr char kThreadsHelp[] =
    "CPU threads (default: OMP_NUM_THREADS, else all cores); on a machine shared with other work, give "
    "fewer than the cores (e.g. the cores left free)";

class Args {
 public:
  // Also takes --threads (kThreadsHelp) and applies it (omp_set_num_threads) when given.
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


// The compute dtype of a run: one rule for every command. The CPU computes in f32 (its bf16 path
// converts every operand to f32 first, and greedy answers of small models drift in bf16); CUDA in
// bf16 (tensor cores, half the memory). `--dtype` overrides it.
DType default_dtype(const Device& device);
inline constexpr char kDtypeHelp[] = "compute dtype: f32 or bf16 (default: f32 on cpu, bf16 on cuda)";
// The value of flag `flag` (f32 or bf16) or, when absent, default_dtype(device); errors name the flag.
absl::StatusOr<DType> dtype_flag(const Args& args, const Device& device, const std::string& flag = "dtype");

// Outputs never go over inputs. `out` (the value of flag `out_flag`) is refused when it is the same
// path as one of `inputs` ({flag, path}; empty paths skipped) or, with `inside`, lies inside one of
// those folders; the error names both flags.
absl::Status check_not_over_inputs(const std::string& out_flag, const std::string& out,
                                   const std::vector<std::pair<std::string, std::string>>& inputs, bool inside);

}  // namespace loom::cli
