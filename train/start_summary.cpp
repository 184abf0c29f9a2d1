// What a run says before its first step: the data as read and packed, the steps, what is trained,
// the checkpointing mode and the memory it expects — so that a run of 2 steps is no surprise.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/memory.h"
#include "train/checkpointing_plan.h"
#include "train/pair_loader.h"
#include "train/run_options.h"
#include "train/trainer_internal.h"

namespace loom {
namespace {

std::string count(int64_t n) {  // 1234567 -> "1,234,567"
  std::string s = absl::StrCat(n < 0 ? -n : n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string bytes(int64_t n) {  // GiB, or MiB below one GiB
  const double d = static_cast<double>(n);
  return n >= (1LL << 30) ? absl::StrFormat("%.2f GiB", d / (1LL << 30)) : absl::StrFormat("%.1f MiB", d / (1LL << 20));
}

std::string plural(int64_t n, const char* one, const char* many) { return absl::StrCat(count(n), " ", n == 1 ? one : many); }

}  // namespace

std::string Trainer::State::start_summary(int64_t steps_per_epoch) const {
  const int64_t world = dist ? dist->world() : 1;
  const int64_t rows = cfg.batch_size * world;
  std::string out;
  for (const std::string& note : model->load_notes()) absl::StrAppend(&out, "model: ", note, "\n");  // e.g. a skipped vision tower
  const bool pairs = cfg.objective != "sft";
  absl::StrAppend(&out, absl::StrFormat("data: %s: %s %s read", cfg.data_path, count(stats.examples),
                                        pairs ? "preference pairs" : "examples"));
  if (stats.skipped > 0) absl::StrAppend(&out, absl::StrFormat(", %s bad lines skipped", count(stats.skipped)));
  if (stats.conversations > 0)
    absl::StrAppend(&out, absl::StrFormat(" (%s rendered with the chat template)", count(stats.conversations)));
  if (pairs) {  // what truncation did, and how pairs become rows
    absl::StrAppend(&out, absl::StrFormat("; %s prompt and %s completion tokens (both sides)", count(pair_stats.prompt_tokens),
                                          count(pair_stats.completion_tokens)));
    if (pair_stats.truncated > 0)
      absl::StrAppend(&out, absl::StrFormat("; %s pairs cut to --max-prompt-len / --seq-len", count(pair_stats.truncated)));
    if (pair_stats.dropped_too_long > 0)
      absl::StrAppend(&out, absl::StrFormat("; %s pairs dropped (the prompt alone reaches --seq-len %d)",
                                            count(pair_stats.dropped_too_long), cfg.seq_len));
    const auto* pl = dynamic_cast<const PairLoader*>(loader.get());
    absl::StrAppend(&out, absl::StrFormat("; objective %s (beta %g), both sequences of a pair in one micro-batch, %s "
                                          "(one sequence a row, %.1f %% of the tokens would be padding)\n",
                                          cfg.objective, cfg.beta, cfg.pair_layout == "pad" ? "padded" : "packed into rows",
                                          pl ? 100.0 * pl->padding_share() : 0.0));
  } else {
    absl::StrAppend(&out, absl::StrFormat("; %s tokens, %s of them targets (%.1f %%); %s rows of %s tokens per epoch after packing\n",
                                          count(stats.tokens), count(stats.target_tokens),
                                          100.0 * static_cast<double>(stats.target_tokens) /
                                              static_cast<double>(std::max<int64_t>(1, stats.tokens)),
                                          count(loader->steps_per_epoch() * rows), count(cfg.seq_len)));
  }
  const std::string in_total =
      cfg.max_steps > 0 ? absl::StrCat("; ", count(total_steps), " in total (--max-steps)")
                        : absl::StrCat(" x ", plural(cfg.epochs, "epoch", "epochs"), " = ", count(total_steps), " in total");
  absl::StrAppend(&out, absl::StrFormat("steps: %s per epoch%s%s (a step: %s = --batch-size %d x --grad-accum %d%s)\n",
                                        count(steps_per_epoch), in_total,
                                        step > 0 ? absl::StrCat(", resuming at ", step) : "",
                                        pairs ? plural(cfg.batch_size * cfg.grad_accum * world, "pair", "pairs")
                                              : plural(rows * cfg.grad_accum, "row", "rows"),
                                        cfg.batch_size, cfg.grad_accum,
                                        world > 1 ? absl::StrCat(" x ", world, " ranks") : ""));
  int64_t total = 0, trainable = 0;
  for (const auto& [name, v] : model->named_weights()) total += v->value().numel();
  for (const auto& p : optimizer->params()) trainable += p.var.value().numel();
  const std::string what = cfg.full ? "every weight" : absl::StrFormat("LoRA r%d%s", cfg.lora.r, cfg.qlora ? " on NF4 weights" : "");
  absl::StrAppend(&out, absl::StrFormat("training: %s of %s (%s parameters): %s trainable (%.2f %%), %s, %s on %s\n", what,
                                        model->config().model_type, count(total), count(trainable),
                                        100.0 * static_cast<double>(trainable) / static_cast<double>(std::max<int64_t>(1, total)),
                                        name(dtype), cfg.optim, device.str()));
  // The weights, adapters and optimizer state are allocated by now; the step adds what the mode keeps
  // (the same estimate --checkpointing auto uses) and the trainable parameters' gradients.
  const int64_t now = memory_stats(device).current_bytes;
  const int64_t grads = trainable * (cfg.full ? bytes_for(dtype, 1) : 4);
  const CheckpointingNeeds needs =
      estimate_checkpointing_needs(model->config(), cfg.batch_size * cfg.seq_len, model->precision().compute, grads);
  const int64_t need = checkpointing == Checkpointing::kNone        ? needs.none
                       : checkpointing == Checkpointing::kRecompute ? needs.recompute
                                                                    : needs.offload;
  absl::StrAppend(&out, absl::StrFormat("memory: --checkpointing %s; expected peak about %s on %s (%s in use now, "
                                        "%s available)\n",
                                        checkpointing_name(checkpointing), bytes(now + need), device.str(), bytes(now),
                                        bytes(device_available_bytes(device))));
  const std::string options = non_default_options(cfg);
  if (!options.empty()) absl::StrAppend(&out, "options: ", options, "\n");
  return out;
}

}  // namespace loom
