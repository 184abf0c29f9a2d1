// `loom train`: fine-tunes a Hugging Face model on a JSONL file (LoRA or full), with progress,
// metrics.jsonl, loss.svg, checkpoints and resume. SIGINT/SIGTERM finish the step, save, exit 0.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/launch_env.h"
#include "train/deepspeed_config.h"
#include "absl/strings/numbers.h"
#include "nlohmann/json.hpp"
#include "engine/precision.h"
#include "tools/commands.h"
#include "train/checkpointing_plan.h"
#include "train/run_options.h"
#include "train/trainer.h"

namespace loom::cli {
namespace {
namespace fs = std::filesystem;

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom train: %s\n", std::string(s.message()).c_str());
  return 1;
}

void on_signal(int) { Trainer::request_stop(); }

// The settings a run stored in its newest checkpoint that has them (`loom train --resume RUN`
// alone continues with them), and the run's folder. Damage is left to the trainer, which falls back
// to an older checkpoint and says so; here an unreadable one is only passed over.
struct StoredRun {
  nlohmann::json options;
  std::string folder;
};
StoredRun stored_run(const std::string& resume) {
  StoredRun r;
  const fs::path p(resume);
  std::error_code ec;
  const bool is_checkpoint = fs::exists(p / "trainer_state.json", ec);
  r.folder = is_checkpoint ? p.parent_path().string() : resume;
  if (r.folder.empty()) r.folder = ".";
  std::vector<std::pair<int64_t, fs::path>> dirs;
  if (is_checkpoint) {
    dirs.emplace_back(0, p);
  } else {
    for (const auto& e : fs::directory_iterator(p, ec)) {
      const std::string n = e.path().filename().string();
      int64_t step = 0;
      if (n.rfind("checkpoint-", 0) == 0 && absl::SimpleAtoi(n.substr(11), &step)) dirs.emplace_back(step, e.path());
    }
    std::sort(dirs.rbegin(), dirs.rend());
  }
  for (const auto& [step, dir] : dirs) {
    std::ifstream f(dir / "trainer_state.json");
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("options") && j["options"].is_object()) {
      r.options = j["options"];
      break;
    }
  }
  return r;
}

}  // namespace

int run_train(const std::vector<std::string>& argv) {
  // The options, from the one table (train/run_options.h): the command line over a --config file
  // over the stored settings of a resumed run over the defaults.
  GivenOptions given;
  bool help = false;
  std::string config_file, deepspeed_file;
  // --deepspeed FILE (or =FILE): DeepSpeed's ds_config.json, read into Loom's flags below.
  std::vector<std::string> args;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--deepspeed" && i + 1 < argv.size()) deepspeed_file = argv[++i];
    else if (argv[i].rfind("--deepspeed=", 0) == 0) deepspeed_file = argv[i].substr(12);
    else if (argv[i] == "--deepspeed") return fail(absl::InvalidArgumentError("--deepspeed needs a value (a ds_config.json)"));
    else args.push_back(argv[i]);
  }
  if (absl::Status s = parse_train_args(args, OptionSource::kCommandLine, given, &help, &config_file); !s.ok()) return fail(s);
  if (help) {
    std::fputs(train_usage().c_str(), stdout);
    return 0;
  }
  if (!config_file.empty()) {
    auto flags = read_config_file(config_file);
    if (!flags.ok()) return fail(flags.status());
    GivenOptions from_file;
    if (absl::Status s = parse_train_args(*flags, OptionSource::kConfigFile, from_file); !s.ok())
      return fail(absl::InvalidArgumentError(absl::StrCat(config_file, ": ", s.message())));
    for (auto& [name, v] : from_file.values) given.values.try_emplace(name, v);  // the command line wins
  }
  if (!deepspeed_file.empty()) {  // under the command line and --config
    auto launch = detect_launch_env();
    if (!launch.ok()) return fail(launch.status());
    auto ds = read_deepspeed_config(deepspeed_file, launch->world_size);
    if (!ds.ok()) return fail(ds.status());
    GivenOptions from_ds;
    if (absl::Status s = parse_train_args(ds->flags, OptionSource::kConfigFile, from_ds); !s.ok())
      return fail(absl::InvalidArgumentError(absl::StrCat(deepspeed_file, ": ", s.message())));
    for (auto& [name, v] : from_ds.values) given.values.try_emplace(name, v);
    if (launch->rank == 0) {
      std::printf("--deepspeed %s: %s\n", deepspeed_file.c_str(),
                  ds->flags.empty() ? "nothing Loom needs to set" : absl::StrJoin(ds->flags, " ").c_str());
      for (const std::string& n : ds->notes) std::printf("  %s\n", n.c_str());
    }
  }
  if (given.has("resume")) {
    std::error_code ec;
    if (!fs::is_directory(given.text("resume"), ec))
      return fail(absl::NotFoundError(absl::StrCat("--resume ", given.text("resume"), ": no such folder (give a run's --out ",
                                                   "folder or one of its checkpoint-<step> folders)")));
    const StoredRun run = stored_run(given.text("resume"));
    if (!given.given("out")) given.values["out"] = {run.folder, OptionSource::kStored};
    if (absl::Status s = merge_stored_options(run.options, given.text("resume"), given); !s.ok()) return fail(s);
  }
  if (given.given("full") && given.text("full") == "true")
    for (const char* lora : {"lora-r", "lora-alpha", "lora-dropout", "lora-targets", "rslora"})
      if (given.given(lora) && given.text(lora) != "false")
        return fail(absl::InvalidArgumentError(absl::StrCat("--full trains every weight; --", lora, " does not apply")));
  auto built = build_train_config(given);
  if (!built.ok()) return fail(built.status());
  const TrainConfig c = *std::move(built);

  // Running out of device memory: the engine says what and how much; this adds what to try with
  // this run's flags (tools/loom.cpp prints it without "internal error").
  std::unique_ptr<Trainer> trainer;
  try {
    auto created = Trainer::create(c);
    if (!created.ok()) return fail(created.status());
    trainer = std::move(*created);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    if (absl::Status s = trainer->run(); !s.ok()) return fail(s);
  } catch (const OutOfMemoryError& e) {
    std::optional<Checkpointing> mode;
    if (trainer) mode = trainer->checkpointing();
    throw OutOfMemoryError(absl::StrCat(e.what(), " ", out_of_memory_advice(c, mode, trainer ? trainer->step() + 1 : 0)));
  }
  if (!c.quiet) std::printf("loom train: %lld steps; output in %s\n", static_cast<long long>(trainer->step()), c.out_dir.c_str());
  return 0;
}

}  // namespace loom::cli
