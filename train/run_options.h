// One table of `loom train`'s run options. Each option is declared once — its name (the flag
// without dashes and the --config key), default, help, check, and whether a resumed run and every
// rank must agree on it — and the flag parser, the config file, the stored settings of a run, the
// resume and rank agreement and the validation of a TrainConfig are all derived from the table.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "train/train_config.h"

namespace loom {

// What a resumed run may do with an option stored by the run it continues.
enum class OnResume {
  kFree,    // may change (--max-steps, --save-every, --device, ...)
  kWarned,  // may change, and the change is said (an optimisation setting: --lr, --schedule, ...)
  kFixed,   // may not change: the data order, the model or the trained state depends on it
};

struct RunOption {
  std::string name;           // flag without dashes; also the config key
  bool is_switch = false;     // takes no value
  std::string default_text;   // the value when not given ("" for none)
  std::string help;
  OnResume on_resume = OnResume::kFree;
  bool ranks_agree = true;    // every MPI rank must be given the same value
  bool stored = true;         // kept in the run's settings (not: --resume, --stop-after, --quiet: this invocation's)
  bool is_path = false;       // stored absolute, so a resumed run finds it from another working directory
  // Parses `text` (a switch: "true"/"false"), checks its range and stores it in the config; errors
  // name the flag and say what was expected.
  std::function<absl::Status(const std::string& text, TrainConfig& c)> set = nullptr;
  // The value in `c` as canonical text, the form set() accepts and stored settings hold.
  std::function<std::string(const TrainConfig& c)> get = nullptr;
};

// The table, in the order --help lists it.
const std::vector<RunOption>& run_options();
const RunOption* find_run_option(std::string_view name);
// The option whose name is closest to a mistyped one ("" when none is close), for "did you mean".
std::string closest_run_option(std::string_view name);

// Where each option's value came from, lowest first: the default, the resumed run's stored
// settings, the --config file, the command line.
enum class OptionSource { kDefault, kStored, kConfigFile, kCommandLine };

// A run's options as given: name -> {text, source} for every option not left at its default.
struct GivenOptions {
  std::map<std::string, std::pair<std::string, OptionSource>> values;
  bool has(const std::string& name) const { return values.count(name) > 0; }
  // The options given on the command line or in a config file (not stored, not defaults).
  bool given(const std::string& name) const;
  std::string text(const std::string& name) const;  // "" when absent
};

// Parses `loom train` arguments into `given` at `source` (the command line, or a config file's
// flags): `--name value`, `--name=value`, a bare switch or `--switch=true|false`; a later value
// wins. An unknown flag is an error suggesting the closest option. --help and --config are not
// options: `help` is set for the first, `config` gets the file of the second.
absl::Status parse_train_args(const std::vector<std::string>& argv, OptionSource source, GivenOptions& given,
                              bool* help = nullptr, std::string* config = nullptr);

// A --config file as flags: `key = value` or `key: value` lines ('#' comments; a switch bare or
// true/false/yes/no/on/off/1/0), keys as the options' names. An unknown key or a bad switch value is
// an error naming file:line (and the closest key).
absl::StatusOr<std::vector<std::string>> read_config_file(const std::string& path);

// Lays `stored` (the settings a resumed run saved: option -> text) under `given`, then refuses,
// naming every one at once, the options that may not change and were given another value.
absl::Status merge_stored_options(const nlohmann::json& stored, const std::string& where, GivenOptions& given);

// Builds the config from the given options (defaults for the rest), running every option's check
// and the checks between options.
absl::StatusOr<TrainConfig> build_train_config(const GivenOptions& given);

// Runs every option's check on a config built in code (a library caller's), and the checks
// between options: the errors name the flags.
absl::Status check_train_config(const TrainConfig& c);

// The stored settings of a run: every stored option -> canonical text (paths made absolute).
nlohmann::json stored_options(const TrainConfig& c);

// The resume differences between two sets of stored settings: {name, saved, now} of each option
// with OnResume::kWarned whose value changed.
std::vector<std::tuple<std::string, std::string, std::string>> warned_changes(const nlohmann::json& saved,
                                                                              const nlohmann::json& now);

// What every rank must agree on, as {--flag, value} pairs for dist::check_agreement.
std::vector<std::pair<std::string, std::string>> rank_agreement_fields(const TrainConfig& c);

// `loom train --help`: every option with its help and default.
std::string train_usage();

// The options not at their default, `--name value` each, for the start summary.
std::string non_default_options(const TrainConfig& c);

}  // namespace loom
