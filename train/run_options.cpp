// What is derived from the table of run options (run_options_table.cpp): the flag parser, the
// config file, the stored settings of a run, resume and rank agreement, help and validation.
#include "train/run_options.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/io_error.h"
#include "engine/precision.h"
#include "engine/status_macros.h"
#include "text/closest_match.h"
#include "train/schedule.h"

namespace loom {
namespace {

std::string absolute_path(const std::string& p) {
  if (p.empty() || p == "chatml") return p;
  std::error_code ec;
  const std::filesystem::path a = std::filesystem::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

}  // namespace

const RunOption* find_run_option(std::string_view name) {
  for (const RunOption& o : run_options())
    if (o.name == name) return &o;
  return nullptr;
}

std::string closest_run_option(std::string_view name) {
  std::vector<std::string> names;
  for (const RunOption& o : run_options()) names.push_back(o.name);
  return closest_match(std::string(name), names);
}

bool GivenOptions::given(const std::string& name) const {
  auto it = values.find(name);
  return it != values.end() && (it->second.second == OptionSource::kCommandLine || it->second.second == OptionSource::kConfigFile);
}

std::string GivenOptions::text(const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? "" : it->second.first;
}

absl::Status parse_train_args(const std::vector<std::string>& argv, OptionSource source, GivenOptions& given, bool* help,
                              std::string* config) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i] == "-h" ? std::string("--help") : argv[i];
    if (arg.rfind("--", 0) != 0)
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "' (flags start with --)"));
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) value = name.substr(eq + 1), name = name.substr(0, eq);
    if (name == "help" && help) {
      *help = true;
      continue;
    }
    const RunOption* o = find_run_option(name);
    const bool is_config = name == "config" && config;
    if (!o && !is_config) {
      const std::string near = closest_run_option(name);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, near.empty() ? "" : absl::StrCat(" (did you mean --", near, "?)"),
                       "; `loom train --help` lists them"));
    }
    if (o && o->is_switch) {
      if (inline_value && value != "true" && value != "false")
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value or true/false, got '", value, "'"));
      given.values[name] = {inline_value ? value : "true", source};
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    if (is_config) *config = value;
    else given.values[name] = {value, source};
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> read_config_file(const std::string& file) {
  if (is_directory_path(file))
    return absl::InvalidArgumentError(absl::StrCat("--config ", file, ": is a folder; it takes a file of key = value lines"));
  std::ifstream f(file);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read config file ", file, ": ", std::strerror(errno)));
  std::vector<std::string> flags;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    size_t hash = line.find('#');
    while (hash != std::string::npos && hash > 0 && line[hash - 1] != ' ' && line[hash - 1] != '\t')
      hash = line.find('#', hash + 1);  // a '#' inside a value (a path) is not a comment
    const std::string l(absl::StripAsciiWhitespace(line.substr(0, hash)));
    if (l.empty()) continue;
    const size_t sep = l.find_first_of("=:");
    const std::string key(absl::StripAsciiWhitespace(l.substr(0, sep)));
    std::string value = sep == std::string::npos ? "" : std::string(absl::StripAsciiWhitespace(l.substr(sep + 1)));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    const std::string where = absl::StrCat(file, ":", n, ": ");
    const RunOption* o = find_run_option(key);
    if (!o) {
      std::string dashed = key;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      const std::string near = find_run_option(dashed) ? dashed : closest_run_option(key);
      return absl::InvalidArgumentError(
          absl::StrCat(where, "unknown key '", key, "'", near.empty() ? "" : absl::StrCat(" (did you mean '", near, "'?)")));
    }
    if (o->is_switch) {
      const std::string v = absl::AsciiStrToLower(value);
      if (sep == std::string::npos || v == "true" || v == "yes" || v == "on" || v == "1") {
        flags.push_back("--" + key);
      } else if (v == "false" || v == "no" || v == "off" || v == "0") {
        flags.push_back("--" + key + "=false");  // over a resumed run's stored true
      } else {
        return absl::InvalidArgumentError(absl::StrCat(where, "'", key, "' is a switch: give true or false (or leave ",
                                                       "the value out), got '", value, "'"));
      }
    } else {
      if (sep == std::string::npos || value.empty())
        return absl::InvalidArgumentError(absl::StrCat(where, "'", key, "' needs a value (`", key, " = ...`)"));
      flags.push_back("--" + key);
      flags.push_back(value);
    }
  }
  return flags;
}

absl::Status merge_stored_options(const nlohmann::json& stored, const std::string& where, GivenOptions& given) {
  if (!stored.is_object()) return absl::OkStatus();
  std::vector<std::string> differ;
  for (const RunOption& o : run_options()) {
    if (!o.stored || !stored.contains(o.name) || !stored[o.name].is_string()) continue;
    const std::string saved = stored[o.name].get<std::string>();
    if (!given.given(o.name)) {
      given.values[o.name] = {saved, OptionSource::kStored};
      continue;
    }
    if (o.on_resume != OnResume::kFixed) continue;
    // Compare canonical forms: --lr 2e-4 and 0.0002 are one value.
    TrainConfig a, b;
    const std::string now = given.text(o.name);
    if (o.name == "dtype") {  // auto is what ran on the device now asked for
      LOOM_RETURN_IF_ERROR(o.set(now, a));
      if (auto d = given.values.find("device"); d != given.values.end())
        LOOM_RETURN_IF_ERROR(find_run_option("device")->set(d->second.first, a));
    } else {
      LOOM_RETURN_IF_ERROR(o.set(now, a));
    }
    if (!o.set(saved, b).ok() || o.get(a) != o.get(b))
      differ.push_back(absl::StrCat("--", o.name, " ", o.get(a), " (the run has ", saved, ")"));
  }
  if (!differ.empty())
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot resume ", where, " with ", absl::StrJoin(differ, ", "), ": ", differ.size() == 1 ? "this setting" : "these settings",
        " may not change in a resumed run (leave ", differ.size() == 1 ? "it" : "them", " out to keep the run's own)"));
  return absl::OkStatus();
}

absl::StatusOr<TrainConfig> build_train_config(const GivenOptions& given) {
  TrainConfig c;
  for (const RunOption& o : run_options()) {
    auto it = given.values.find(o.name);
    if (it != given.values.end()) {
      LOOM_RETURN_IF_ERROR(o.set(it->second.first, c));
    } else if (!o.default_text.empty()) {
      LOOM_RETURN_IF_ERROR(o.set(o.default_text, c));
    }
  }
  LOOM_RETURN_IF_ERROR(check_train_config(c));
  return c;
}

absl::Status check_train_config(const TrainConfig& c) {
  for (const RunOption& o : run_options()) {
    TrainConfig scratch;
    LOOM_RETURN_IF_ERROR(o.set(o.get(c), scratch));
  }
  for (const char* required : {"model", "data", "out"})
    if (find_run_option(required)->get(c).empty())
      return absl::InvalidArgumentError(absl::StrCat("--", required, " is required (or --resume RUN_FOLDER to continue a run)"));
  if (c.qlora && c.full)
    return absl::InvalidArgumentError("--qlora trains LoRA adapters on a frozen 4-bit model; it cannot be combined with --full");
  if (!c.max_memory.empty() && c.device_map.empty())
    return absl::InvalidArgumentError("--max-memory caps the devices of a --device-map: add --device-map auto");
  if (!c.device_map.empty() && !c.dist.empty())
    return absl::InvalidArgumentError(absl::StrCat("--device-map splits one model over the GPUs of one process; --dist ",
                                                   c.dist, " gives each rank a whole copy: use one or the other"));
  if (!c.device_map.empty() && c.full)
    return absl::InvalidArgumentError("--device-map trains LoRA or QLoRA adapters (streamed layers are frozen); --full "
                                      "fine-tuning of a model larger than one GPU: --dist zero2 over several");
  if (c.eval_every > 0 && c.eval_data_path.empty())
    return absl::InvalidArgumentError("--eval-every needs --eval-data (the held-out JSONL to evaluate)");
  if (c.precompute_ref && c.objective != "dpo" && c.objective != "ipo")
    return absl::InvalidArgumentError(absl::StrCat("--precompute-ref scores pairs under a reference model, which only ",
                                                   "--objective dpo and ipo have (", c.objective, " has none)"));
  if (c.objective == "sft" && (c.beta != 0.1 || c.simpo_gamma != 0.5 || c.label_smoothing != 0 || c.max_prompt_len != 0))
    return absl::InvalidArgumentError("--beta, --simpo-gamma, --label-smoothing and --max-prompt-len belong to the "
                                      "preference objectives: add --objective dpo|ipo|simpo|orpo");
  return absl::OkStatus();
}

nlohmann::json stored_options(const TrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const RunOption& o : run_options()) {
    if (!o.stored) continue;
    j[o.name] = o.is_path ? absolute_path(o.get(c)) : o.get(c);
  }
  return j;
}

std::vector<std::tuple<std::string, std::string, std::string>> warned_changes(const nlohmann::json& saved,
                                                                              const nlohmann::json& now) {
  std::vector<std::tuple<std::string, std::string, std::string>> out;
  for (const RunOption& o : run_options()) {
    if (o.on_resume != OnResume::kWarned || !saved.contains(o.name) || !now.contains(o.name)) continue;
    if (saved[o.name] != now[o.name]) out.emplace_back(o.name, saved[o.name].get<std::string>(), now[o.name].get<std::string>());
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> rank_agreement_fields(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> fields;
  for (const RunOption& o : run_options())
    if (o.ranks_agree) fields.emplace_back("--" + o.name, o.get(c));
  return fields;
}

std::string train_usage() {
  std::string out =
      "usage: loom train --model M --data D --out RUN [flags]\n"
      "       loom train --resume RUN [flags that may change]\n"
      "       loom train --config FILE [flags]   (FILE: `key = value` lines, keys as the flags; the command line wins)\n";
  for (const RunOption& o : run_options()) {
    absl::StrAppend(&out, "  --", o.name, o.is_switch ? "" : " VALUE", "\n      ", o.help);
    if (!o.default_text.empty()) absl::StrAppend(&out, " (default ", o.default_text, ")");
    if (o.on_resume == OnResume::kFixed) absl::StrAppend(&out, " [fixed: --resume keeps the run's]");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out,
                  "  --config FILE\n      flags from a file of `key = value` lines (command line wins)\n"
                  "  --deepspeed FILE\n      a DeepSpeed ds_config.json read as Loom's flags: ZeRO stage, optimizer "
                  "offload, batch sizes, clipping, precision, AdamW and warmup (\"auto\": Loom's own; the command line and "
                  "--config win)\n"
                  "  --help\n      show this help\n"
                  "\nThreads: OpenMP uses every core; on a shared machine set OMP_NUM_THREADS to the cores you may use.\n");
  return out;
}

std::string non_default_options(const TrainConfig& c) {
  TrainConfig d;
  d.device = c.device;  // the dtype's default depends on it
  std::vector<std::string> parts;
  for (const RunOption& o : run_options()) {
    if (!o.stored) continue;
    const std::string v = o.get(c);
    TrainConfig def = d;
    if (!o.default_text.empty() && o.set(o.default_text, def).ok() && o.get(def) == v) continue;
    if (o.default_text.empty() && v == o.get(d)) continue;
    parts.push_back(o.is_switch ? absl::StrCat("--", o.name) : absl::StrCat("--", o.name, " ", v));
  }
  return absl::StrJoin(parts, " ");
}

}  // namespace loom
