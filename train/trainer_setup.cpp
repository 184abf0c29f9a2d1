// Setting a run up: the config file's flags, and Trainer::create (checks, model, data, adapters,
// optimizer, resume point).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "dist/launch_env.h"
#include "engine/io_error.h"
#include "engine/memory.h"
#include "engine/offload.h"
#include "engine/status_macros.h"
#include "optim/adamw.h"
#include "train/optimizer_memory.h"
#include "train/run_options.h"
#include "train/pair_loader.h"
#include "train/trainer_internal.h"
#include "train/run_placement.h"
#include "models/gguf_model.h"

namespace loom {
namespace fs = std::filesystem;

nlohmann::json fingerprint(const std::vector<Example>& examples) {
  uint64_t h = 0xCBF29CE484222325ull, tokens = 0;
  for (const Example& e : examples) {
    for (size_t i = 0; i < e.ids.size(); ++i) h = (h ^ (static_cast<uint64_t>(e.ids[i]) * 2 + e.target[i])) * 0x100000001B3ull;
    h = (h ^ 0xFFFFFFFFull) * 0x100000001B3ull;  // document boundary
    tokens += e.ids.size();
  }
  return {{"examples", examples.size()}, {"tokens", tokens}, {"hash", absl::StrFormat("%016x", h)}};
}

namespace {

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::create(const TrainConfig& cfg) {
  auto s = std::make_unique<State>();
  s->cfg = cfg;
  // Every option's range and the checks between options, from the one table (run_options.h).
  LOOM_RETURN_IF_ERROR(check_train_config(cfg));
  LaunchEnv launch;
  LOOM_ASSIGN_OR_RETURN(launch, detect_launch_env());
  if (launch.world_size > 1 && cfg.dist.empty())
    return absl::InvalidArgumentError(absl::StrCat("launched as rank ", launch.rank, " of ", launch.world_size, " (",
                                                   launch.launcher, "): choose --dist ddp or --dist zero2"));
  s->device = cfg.device;
  if (!cfg.dist.empty()) {  // each rank takes cuda:<local rank>
    LOOM_ASSIGN_OR_RETURN(s->dist, DistContext::create(cfg.dist, cfg.dist_timeout, s->device.is_cuda()));
    s->device = s->dist->device();
    set_offload_host_sharers(s->dist->local_world());  // the ranks on this host share its pinned budget
  }
  if (s->device.is_cuda() && s->device.index >= cuda_device_count())
    return absl::InvalidArgumentError(absl::StrCat("--device ", cfg.device.str(), ": no such CUDA device (",
                                                   cuda_device_count(), " visible)"));
  s->dtype = cfg.resolved_dtype();
  ops::set_gemm_autotune(cfg.gemm_autotune);
  LrScheduleKind kind;
  LOOM_ASSIGN_OR_RETURN(kind, parse_lr_schedule(cfg.schedule));
  PreferenceParams pref;
  pref.beta = cfg.beta, pref.simpo_gamma = cfg.simpo_gamma, pref.label_smoothing = cfg.label_smoothing;
  LOOM_ASSIGN_OR_RETURN(s->objective, make_objective(cfg.objective, pref));
  const bool pairs = cfg.objective != "sft";

  if (path_is_within(cfg.out_dir, cfg.model_dir) && path_is_within(cfg.model_dir, cfg.out_dir))
    return absl::InvalidArgumentError(absl::StrCat("--out ", cfg.out_dir, " is the --model folder: the run's adapter and ",
                                                   "checkpoints (with --full, the model) would be written over it"));
  std::error_code ec;
  if (cfg.full && fs::exists(fs::path(cfg.out_dir) / "model.safetensors.index.json", ec))
    return absl::AlreadyExistsError(absl::StrCat("--out ", cfg.out_dir, " holds a sharded model (model.safetensors.index.",
                                                 "json): the trained model could not be saved there; choose another folder"));
  // One rule for every writer: an earlier run's outputs are replaced only when asked.
  if (cfg.resume.empty() && !cfg.overwrite) {
    std::vector<std::string> earlier;
    for (const char* f : {"adapter_model.safetensors", "model.safetensors", "metrics.jsonl"})
      if (fs::exists(fs::path(cfg.out_dir) / f, ec)) earlier.push_back(f);
    for (const auto& e : fs::directory_iterator(cfg.out_dir, ec))
      if (e.path().filename().string().rfind("checkpoint-", 0) == 0) earlier.push_back(e.path().filename().string());
    if (!earlier.empty()) {
      std::sort(earlier.begin(), earlier.end());
      if (earlier.size() > 4) earlier.resize(4), earlier.back() = "...";
      return absl::AlreadyExistsError(absl::StrCat("--out ", cfg.out_dir, " holds an earlier run (", absl::StrJoin(earlier, ", "),
                                                   "): --resume ", cfg.out_dir, " continues it, --overwrite replaces it; ",
                                                   "or choose another folder"));
    }
  }
  // The output folder must be writable before hours of training are spent.
  fs::create_directories(cfg.out_dir, ec);
  const fs::path probe = fs::path(cfg.out_dir) / absl::StrCat(".write-test.", getpid());
  if (ec || !std::ofstream(probe)) return absl::PermissionDeniedError(absl::StrCat("output folder ", cfg.out_dir, " is not writable"));
  fs::remove(probe, ec);
  // Leftovers of earlier runs: temporary folders of killed saves now; a fresh run's stale
  // checkpoints at its first save (State::remove_stale_checkpoints), once this run has started.
  if (!s->dist || s->dist->root()) {
    const std::vector<std::string> removed = clean_output_folder(cfg.out_dir, /*fresh_run=*/false);
    if (!removed.empty() && !cfg.quiet)
      std::printf("removed %zu leftover folder(s) of an earlier run from %s: %s\n", removed.size(), cfg.out_dir.c_str(),
                  absl::StrJoin(removed, ", ").c_str());
  }
  s->stale_checkpoints = cfg.resume.empty();

  LoadOptions load;
  load.dtype = s->dtype;
  load.device = s->device;
  load.quantize_4bit = cfg.qlora;
  load.allow_nonfinite = cfg.allow_nonfinite;
  if (!cfg.full && !cfg.qlora && s->dtype == DType::bf16 && cfg.lora.dropout == 0.f) {
    // The norm readers' weights load with room for the adapters' one-GEMM product (3 r + 1 columns,
    // the largest rank of the run; LoadOptions::adapter_room), not widened later when attached.
    int64_t r = cfg.lora.r;
    for (const auto& [pattern, rank] : cfg.lora.rank_pattern) r = std::max(r, rank);
    load.adapter_room = 3 * r + 1;
  }
  std::optional<Checkpointing> planned_mode;  // --device-map chooses the mode with the plan
  if (!cfg.device_map.empty()) {
    if (is_gguf_path(cfg.model_dir))
      return absl::UnimplementedError(absl::StrCat("--device-map with a .gguf model (", cfg.model_dir,
                                                   "): convert it to a Hugging Face folder first (loom convert)"));
    ModelConfig mc;
    LOOM_ASSIGN_OR_RETURN(mc, ModelConfig::load(cfg.model_dir));
    PlanOptions po;
    po.weight_dtype = po.activation_dtype = s->dtype;
    po.qlora = cfg.qlora;
    po.lora_r = cfg.lora.r;
    po.lora_targets = cfg.lora.target_modules;
    if (!cfg.lora.target_parameters.empty()) po.lora_targets.push_back("experts");
    po.tokens = cfg.batch_size * cfg.seq_len;
    Checkpointing mode = Checkpointing::kNone;
    RunPlacement rp;
    LOOM_ASSIGN_OR_RETURN(rp, plan_run_placement(mc, cfg.device_map, cfg.max_memory, po, cfg.checkpointing, &mode));
    planned_mode = mode;
    load.placement = rp.placement;
    if (!cfg.quiet) std::printf("%s", rp.description.c_str());
  }
  if (cfg.random_init) {
    LOOM_ASSIGN_OR_RETURN(s->model, CausalLM::init_random(cfg.model_dir, load, cfg.seed));
  } else {
    LOOM_ASSIGN_OR_RETURN(s->model, CausalLM::load(cfg.model_dir, load));
  }
  if (cfg.full)
    for (const Linear* l : s->model->linears())
      if (l->quantized())
        return absl::InvalidArgumentError(absl::StrCat(cfg.model_dir, " is a 4-bit checkpoint (", l->name,
                                                       "): full fine-tuning needs full-precision weights; use LoRA"));
  const ModelConfig& mc = s->model->config();
  if (mc.moe.experts > 0)
    s->objective->set_router_aux_loss(cfg.router_aux_loss_coef < 0 ? mc.moe.router_aux_loss_coef : cfg.router_aux_loss_coef);
  s->checkpointing = planned_mode.value_or(cfg.checkpointing.value_or(Checkpointing::kNone));
  // What every mode adds alike: the trainable parameters' gradients and optimizer state (full
  // fine-tuning: about 16 bytes each; LoRA's adapters are small; the loss's workspace is the estimate's).
  int64_t fixed = 0;
  // Sizes are bounded one by one (run_options.cpp); their product may still be past any machine (and
  // past int64 in the estimate below): one layer's activations of a micro-batch, in double first.
  const double layer_bytes = static_cast<double>(cfg.batch_size) * static_cast<double>(cfg.seq_len) *
                             static_cast<double>(2 * mc.intermediate_size + 9 * mc.hidden_size) * 4.0;
  if (layer_bytes > static_cast<double>(device_available_bytes(s->device)))
    return absl::ResourceExhaustedError(absl::StrFormat(
        "one decoder layer's activations of a micro-batch (%d x %d tokens) would take about %.3g GiB and %.1f GiB are "
        "available on %s: use a smaller --batch-size or --seq-len",
        cfg.batch_size, cfg.seq_len, layer_bytes / (1LL << 30),
        static_cast<double>(device_available_bytes(s->device)) / (1LL << 30), s->device.str()));
  if (cfg.full)
    for (const auto& [name, v] : s->model->named_weights()) fixed += 16 * v->value().numel();
  const CheckpointingNeeds needs =
      estimate_checkpointing_needs(mc, cfg.batch_size * cfg.seq_len, s->model->precision().compute, fixed);
  const int64_t available = device_available_bytes(s->device);
  if (!cfg.checkpointing && !planned_mode) {  // auto; on the CPU offload is recompute (the inputs are in host memory anyway)
    CheckpointingChoice choice = choose_checkpointing(needs, available, s->device.str());
    if (s->device.is_cpu() && choice.mode == Checkpointing::kOffload) choice.mode = Checkpointing::kRecompute;
    s->checkpointing = choice.mode;
    if (!cfg.quiet && (!s->dist || s->dist->root()) && (s->device.is_cuda() || choice.mode != Checkpointing::kNone))
      std::printf("%s\n", choice.reason.c_str());
  }
  // A run that cannot fit is refused before it starts, with what to try. The estimate is an upper
  // bound, so only a need of twice what is available is certain to fail.
  const int64_t need = s->checkpointing == Checkpointing::kNone        ? needs.none
                       : s->checkpointing == Checkpointing::kRecompute ? needs.recompute
                                                                       : needs.offload;
  if (need > 2 * available && !planned_mode)  // a --device-map plan has fitted the run to every device
    return absl::ResourceExhaustedError(absl::StrFormat(
        "this run needs about %.1f GiB on %s (--checkpointing %s, %d x %d tokens a micro-batch) and %.1f GiB are "
        "available. %s",
        static_cast<double>(need) / (1LL << 30), s->device.str(), checkpointing_name(s->checkpointing), cfg.batch_size,
        cfg.seq_len, static_cast<double>(available) / (1LL << 30), out_of_memory_advice(cfg, s->checkpointing, 1)));
  s->model->set_checkpointing(s->checkpointing);
  if (cfg.seq_len > mc.max_position_embeddings)
    return absl::InvalidArgumentError(absl::StrCat("--seq-len ", cfg.seq_len, " exceeds the model's max_position_embeddings ",
                                                   mc.max_position_embeddings, " (", cfg.model_dir, "/config.json)"));
  LOOM_ASSIGN_OR_RETURN(s->tokenizer, Tokenizer::load(cfg.model_dir));
  LOOM_RETURN_IF_ERROR(s->tokenizer.fits_vocab(mc.vocab_size));
  DataOptions dopt;
  dopt.skip_bad_lines = cfg.skip_bad_lines;
  std::string template_note;
  dopt.chat_template = training_chat_template(cfg.model_dir, cfg.chat_template, &template_note);
  std::vector<Example> examples;
  std::vector<PreferenceExample> pair_data;
  PreferenceDataOptions popt;
  popt.skip_bad_lines = cfg.skip_bad_lines;
  popt.chat_template = dopt.chat_template;
  popt.max_len = cfg.seq_len;
  popt.max_prompt_len = cfg.max_prompt_len;
  if (pairs) {  // TRL's preference formats; the data summary counts pairs as examples
    LOOM_ASSIGN_OR_RETURN(pair_data, load_preference_jsonl(cfg.data_path, s->tokenizer, popt, &s->pair_stats));
    s->stats.lines = s->pair_stats.lines, s->stats.examples = s->pair_stats.pairs, s->stats.skipped = s->pair_stats.skipped;
    s->stats.conversations = s->pair_stats.conversations;
    s->stats.tokens = s->pair_stats.prompt_tokens + s->pair_stats.completion_tokens;
    s->stats.target_tokens = s->pair_stats.completion_tokens;
    examples = pair_documents(pair_data);  // the fingerprint's view of a pair: two documents
  } else {
    LOOM_ASSIGN_OR_RETURN(examples, load_jsonl(cfg.data_path, s->tokenizer, dopt, &s->stats));
  }
  // Which template conversations got: said only when the data has some; a template that cannot be
  // used, once (under --skip-bad-lines the lines that needed it were skipped).
  if (!template_note.empty() && !cfg.quiet && s->stats.conversations > 0)
    std::fprintf(stderr, "loom train: %s\n", template_note.c_str());
  if (s->stats.template_skipped > 0)
    std::fprintf(stderr, "loom train: skipped %lld line(s) that need the chat template; the first: %s\n",
                 static_cast<long long>(s->stats.template_skipped), s->stats.template_error.c_str());
  // With --skip-bad-lines: how many lines of a data file were left out.
  auto say_skipped = [&](const DataStats& st, const std::string& path) {
    if (cfg.skip_bad_lines && st.skipped > 0 && !cfg.quiet)
      std::fprintf(stderr, "loom train: skipped %lld bad line(s) of %lld in %s\n", static_cast<long long>(st.skipped),
                   static_cast<long long>(st.lines), path.c_str());
  };
  say_skipped(s->stats, cfg.data_path);
  s->data_fingerprint = fingerprint(examples);
  const int32_t pad = static_cast<int32_t>(s->tokenizer.eos_id().value_or(0));
  // Every rank packs the global batch (the same on any number of ranks) and trains on its rows.
  const int64_t world = s->dist ? s->dist->world() : 1;
  if (cfg.precompute_ref) s->reference_pairs = pair_data;  // scored once the adapters exist
  if (!cfg.eval_data_path.empty() && pairs) {
    LOOM_RETURN_IF_ERROR(s->load_eval_pairs(popt, pad, world, static_cast<int64_t>(pair_data.size())));
  } else if (!cfg.eval_data_path.empty()) {
    std::vector<Example> held_out;
    LOOM_ASSIGN_OR_RETURN(held_out, load_jsonl(cfg.eval_data_path, s->tokenizer, dopt, &s->eval_stats));
    say_skipped(s->eval_stats, cfg.eval_data_path);
    if (s->eval_stats.target_tokens == 0)
      return absl::InvalidArgumentError(absl::StrCat("--eval-data ", cfg.eval_data_path, ": no token to take a loss on ",
                                                     "(every target is masked)"));
    PackedLoader pass(std::move(held_out), cfg.seq_len, cfg.batch_size * world, cfg.seed, 0, 1, pad);
    for (int64_t i = 0; i < pass.steps_per_epoch(); ++i) s->eval_batches.push_back(pass.next());
  }
  if (s->dist) LOOM_RETURN_IF_ERROR(s->dist->agree(cfg, mc.summary(), s->stats, s->eval_stats));
  // A step's micro-batches are packed on the host before it runs: 4 int32 values per token.
  const double step_bytes = 16.0 * static_cast<double>(cfg.batch_size * world) * static_cast<double>(cfg.grad_accum) *
                            static_cast<double>(cfg.seq_len);
  if (step_bytes > static_cast<double>(device_available_bytes(Device::cpu())) / 2)
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a step's %d micro-batches of %d x %d tokens would take %.3g GiB of host memory to pack, more than half of the "
        "%.1f GiB available: use a smaller --grad-accum or --batch-size",
        cfg.grad_accum, cfg.batch_size * world, cfg.seq_len, step_bytes / (1LL << 30),
        static_cast<double>(device_available_bytes(Device::cpu())) / (1LL << 30)));
  if (pairs)  // --batch-size pairs a micro-batch, each pair's two sequences padded to the batch's longest
    s->loader = std::make_unique<PairLoader>(std::move(pair_data), cfg.batch_size * world, cfg.seed, pad,
                                             pair_layout(cfg), world);
  else
    s->loader = std::make_unique<PackedLoader>(std::move(examples), cfg.seq_len, cfg.batch_size * world, cfg.seed, 0, 1, pad);
  const int64_t per_epoch = std::max<int64_t>(1, s->loader->steps_per_epoch() / cfg.grad_accum);
  s->total_steps = cfg.max_steps > 0 ? cfg.max_steps : per_epoch * cfg.epochs;
  s->schedule = LrSchedule{kind, cfg.warmup_steps, s->total_steps};

  std::optional<std::string> resume_dir;
  TrainCheckpoint resume_from;
  if (!cfg.resume.empty()) {
    ResumePoint point;
    LOOM_ASSIGN_OR_RETURN(point, find_resume_checkpoint(cfg.resume, {.no_verify = cfg.no_verify}));
    for (const std::string& bad : point.skipped)
      std::fprintf(stderr, "loom train: skipping %s; falling back to an older checkpoint\n", bad.c_str());
    if (path_is_within(cfg.out_dir, point.dir))
      return absl::InvalidArgumentError(absl::StrCat("--out ", cfg.out_dir, " lies inside the checkpoint ", point.dir,
                                                     " that --resume continues from: its files would be written over; ",
                                                     "give the run's folder as --out (the one that holds checkpoint-<step>)"));
    resume_dir = point.dir;
    resume_from = std::move(point.checkpoint);
    LOOM_RETURN_IF_ERROR(s->check_compatible(point.dir, resume_from.state));  // before touching its adapter
  }
  std::unique_ptr<optim::UpdateRule> rule;
  // --offload-optimizer: masters and state in pinned host memory, the update on the CPU.
  const Device state_device = cfg.offload_optimizer ? Device::cpu() : s->device;
  LOOM_ASSIGN_OR_RETURN(rule, optim::make_update_rule(cfg.optim, {cfg.beta1, cfg.beta2, cfg.eps}, state_device));
  s->optimizer = std::make_unique<optim::Optimizer>(
      std::move(rule), /*sharded=*/s->dist && s->dist->zero2(),
      cfg.offload_optimizer ? optim::Placement::kHost : optim::Placement::kDevice);
  const int decay = s->optimizer->add_group({"decay", 1.f, cfg.weight_decay});
  if (cfg.full) {
    // Norms and biases get no weight decay, as transformers' Trainer excludes them.
    const int no_decay = s->optimizer->add_group({"no_decay", 1.f, 0.f});
    s->model->set_weights_trainable(true);
    for (auto& [name, v] : s->model->named_weights()) {
      const bool exempt = name.find("norm") != std::string::npos || name.ends_with(".bias");
      s->optimizer->add_param(name, *v, exempt ? no_decay : decay);
    }
  } else {
    if (resume_dir) {
      LoraConfig saved;
      LOOM_ASSIGN_OR_RETURN(saved, load_adapter(*s->model, *resume_dir));
      s->cfg.lora = saved;
      seed_lora_dropout(*s->model, cfg.seed);  // the streams add_lora gave the interrupted run
    } else {
      LOOM_RETURN_IF_ERROR(add_lora(*s->model, cfg.lora, cfg.seed));
    }
    for (Linear* l : s->model->linears())
      if (l->lora) l->lora->training = true;
    for (auto& [name, v] : lora_parameters(*s->model)) s->optimizer->add_param(name, *v, decay);
  }
  if (s->dist) s->dist->attach(*s->optimizer, cfg.quiet);
  else if (cfg.offload_optimizer && !cfg.quiet) print_offload_summary(*s->optimizer);
  if (resume_dir) LOOM_RETURN_IF_ERROR(s->restore(*resume_dir, resume_from));
  LOOM_RETURN_IF_ERROR(s->prepare_reference(load, resume_dir.has_value()));
  if (!cfg.quiet && (!s->dist || s->dist->root())) std::printf("%s", s->start_summary(per_epoch).c_str());
  if (s->dist && !s->dist->root()) return std::unique_ptr<Trainer>(new Trainer(std::move(s)));  // rank 0 writes
  auto metrics = MetricsWriter::open(cfg.out_dir, resume_dir ? std::optional<int64_t>(s->step) : std::nullopt);
  if (!metrics.ok()) return metrics.status();
  s->metrics.emplace(*std::move(metrics));
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

}  // namespace loom
