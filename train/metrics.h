// Training metrics: one JSON object per optimizer step appended to <out>/metrics.jsonl (flushed per
// line, so a crash loses at most the step in flight), and an SVG chart of loss against step (with a
// preference objective's reward margin and accuracy below it).
#pragma once
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

struct StepMetrics {
  int64_t step = 0;          // optimizer updates done, 1-based
  double epoch = 0;          // fractional epoch at the end of the step
  double loss = 0;           // mean loss over the step's tokens (NaN is written as null)
  double lr = 0;             // learning rate used by this update
  double grad_norm = 0;      // global gradient norm before clipping
  int64_t target_tokens = 0; // tokens with a loss (the loss is their mean), this step, over all ranks
  int64_t input_tokens = 0;  // every non-padding token the step read (targets and the rest), over all ranks
  double tokens_per_s = 0;   // input_tokens / the step's wall seconds: what throughput figures count
  int64_t mem_bytes = 0;     // peak device (or host) bytes in use
  int64_t host_mem_bytes = -1;  // peak pinned bytes of offloaded activations (written when >= 0)
  std::optional<double> eval_loss;  // --eval-data's mean loss after this step (written when evaluated)
  // The objective's own measures (train/objective.h: TRL's "rewards/chosen", ... for preference
  // objectives), means over the step's units, written after the fields above.
  std::vector<std::pair<std::string, double>> extra;
};

class MetricsWriter {
 public:
  // Opens <out_dir>/metrics.jsonl (creating out_dir). A fresh run (resume_step empty) starts an
  // empty file at its first write (a run that fails before then leaves the old file alone); a
  // resumed run keeps the lines with step <= *resume_step and drops the rest (the steps after the
  // checkpoint, which will be trained again), then appends.
  static absl::StatusOr<MetricsWriter> open(const std::string& out_dir, std::optional<int64_t> resume_step = {});

  // Appends {"step", "epoch", "loss", "lr", "grad_norm", "target_tokens", "input_tokens", "tokens_per_s", "mem_bytes"}
  // (and "host_mem_bytes", "eval_loss" when set) as one line and flushes it.
  absl::Status write(const StepMetrics& m);
  const std::string& path() const { return path_; }

 private:
  MetricsWriter(std::string path, std::ofstream out, bool truncate_on_first_write)
      : path_(std::move(path)), out_(std::move(out)), truncate_on_first_write_(truncate_on_first_write) {}
  std::string path_;
  std::ofstream out_;
  bool truncate_on_first_write_;
};

// One line of metrics.jsonl as JSON text (no newline); non-finite numbers become null.
std::string metrics_json_line(const StepMetrics& m);

// Draws loss against step from a metrics.jsonl into a self-contained SVG (axes, ticks, labels,
// title; eval_loss, where there is some, as a second line with a legend; a preference objective's
// rewards/margins and rewards/accuracies, with their eval_ values, as two more charts below), written to a temporary
// file next to svg_path and renamed into place. Lines whose loss is null are left out; a truncated
// last line (a crash mid-write) is ignored; any other line that is not a JSON object with numeric
// "step" is an error naming the file and line. With no points the chart is drawn empty, saying so.
absl::Status write_loss_svg(const std::string& metrics_jsonl_path, const std::string& svg_path);

}  // namespace loom
