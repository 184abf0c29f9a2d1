// The training loop (see trainer.h): a step's batches to the device, forward and backward, the
// update, metrics and checkpoints. Setup is in trainer_setup.cpp, checkpoints in trainer_state.cpp.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "kernels/grad_norm.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/memory.h"
#include "engine/offload.h"
#include "engine/stream_mark.h"
#include "engine/transfer.h"
#include "engine/status_macros.h"
#include "train/trainer_internal.h"

namespace loom {
namespace {

std::atomic<bool> g_stop{false};

std::string format_duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? absl::StrCat(t / 3600, "h", (t % 3600) / 60, "m") : absl::StrCat(t / 60, "m", t % 60, "s");
}

// The held-out accuracy of a preference objective for the progress line ("" for SFT).
std::string eval_acc(const std::vector<std::pair<std::string, double>>& extra) {
  for (const auto& [k, v] : extra)
    if (k == "eval_rewards/accuracies") return absl::StrFormat(" (acc %.2f)", v);
  return "";
}

}  // namespace

// No dropout, no tape; every rank takes its rows of each global batch and the sums are global, so
// any world size gives the same figure. Each batch's loss is read back: evaluation is not the hot path.
absl::StatusOr<double> Trainer::State::evaluate(std::vector<std::pair<std::string, double>>* measures) {
  ag::NoGradGuard no_grad;
  std::vector<LoraAdapter*> dropping;
  for (Linear* l : model->linears())
    if (l->lora && l->lora->training) dropping.push_back(l->lora.get()), l->lora->training = false;
  absl::Cleanup train_again = [&] {
    for (LoraAdapter* w : dropping) w->training = true;
  };
  // Sums over the objective's units (SFT: target tokens) of the loss, then of each measure. The
  // measures are listed by the objective, the same on every rank (one whose rows had no units adds
  // zeros), so that the sums over the ranks line up.
  objective->begin_step(eval_batches);  // the pass is one mean over all its units
  std::vector<std::string> names;
  for (const auto& [k, v] : objective->metrics()) names.push_back(k);
  for (const auto& [k, v] : objective->device_metrics()) names.push_back(k);
  std::vector<double> sums(names.size() + 1, 0.0);
  int64_t units = 0;
  for (const Batch& global : eval_batches) {
    units += objective->units(global);
    const Batch b = dist ? dist->slice(global) : global;
    const int64_t mine = objective->units(b);
    if (mine == 0) continue;
    std::vector<DeviceBatch> d;
    LOOM_ASSIGN_OR_RETURN(d, upload({b}, device, model->config().vocab_size));
    sums[0] += objective->loss(*model, d[0]).value().to_doubles()[0] * static_cast<double>(mine);
    std::vector<std::pair<std::string, double>> m = objective->metrics();
    for (const auto& [k, t] : objective->device_metrics()) m.emplace_back(k, t.to_doubles()[0]);
    for (size_t i = 0; i < m.size() && i < names.size(); ++i) sums[i + 1] += m[i].second * static_cast<double>(mine);
  }
  if (dist) dist->sum(sums);
  if (measures)
    for (size_t i = 0; i < names.size(); ++i) measures->emplace_back(names[i], sums[i + 1] / static_cast<double>(units));
  return sums[0] / static_cast<double>(units);
}

Trainer::Trainer(std::unique_ptr<State> state) : s_(std::move(state)) {}
Trainer::~Trainer() = default;
void Trainer::request_stop() { g_stop.store(true); }
int64_t Trainer::step() const { return s_->step; }
int64_t Trainer::total_steps() const { return s_->total_steps; }
const std::vector<float>& Trainer::losses() const { return s_->losses; }
const CausalLM& Trainer::model() const { return *s_->model; }
Checkpointing Trainer::checkpointing() const { return s_->checkpointing; }

// LOOM_STEP_TIMING=1: each step prints to stderr where its wall time went, the GPU's side from
// marks on the compute stream (engine/stream_mark.h): idle before the step's first work, the
// forward and backward, clipping and the update, each beside the host's time to queue it.
struct Trainer::StepTiming {
  bool on = std::getenv("LOOM_STEP_TIMING") != nullptr;
  StreamMark prev_end;
  std::chrono::steady_clock::time_point data_done, queued_fb, queued_opt;
  StreamMark start, fb, opt;
  void print(int64_t step, std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point read) {
    using ms = std::chrono::duration<double, std::milli>;
    const double idle = prev_end.recorded() ? StreamMark::elapsed_ms(prev_end, start) : 0.0;
    std::fprintf(stderr,
                 "step %lld timing (ms): device idle before %.2f | device fwd+bwd %.2f (host queued it in %.2f) | device "
                 "clip+update %.2f (host %.2f) | host: data %.2f, waiting for the GPU %.2f\n",
                 static_cast<long long>(step), idle, StreamMark::elapsed_ms(start, fb), ms(queued_fb - data_done).count(),
                 StreamMark::elapsed_ms(fb, opt), ms(queued_opt - queued_fb).count(), ms(data_done - t0).count(),
                 ms(read - queued_opt).count());
    prev_end = opt;
  }
};

namespace {

// A step's scalars (its loss, the objective's device measures, the gradient norm and clip
// coefficient) on their way to the host: each copied into pinned memory on its device's download
// stream after the work queued so far, so that the host can queue the next step before it reads them.
class ScalarsInFlight {
 public:
  void add(const Tensor& t) {
    const Tensor src = t.contiguous();
    Tensor host = src.is_cpu() ? Tensor::empty(src.shape(), src.dtype(), src.device())
                               : Tensor::empty_pinned(src.shape(), src.dtype());
    events_.push_back(copy_to_host_async(src, host));
    src_.push_back(src), host_.push_back(std::move(host));
  }
  // Every value added, in order, once all have landed.
  std::vector<double> values() const {
    std::vector<double> v;
    for (size_t i = 0; i < host_.size(); ++i) {
      events_[i].wait();
      const std::vector<double> h = host_[i].to_doubles();
      v.insert(v.end(), h.begin(), h.end());
    }
    return v;
  }

 private:
  std::vector<Tensor> src_, host_;  // the sources stay alive until their copies are done
  std::vector<TransferEvent> events_;
};

}  // namespace

// A step whose work is queued and whose results are read by finish_step.
struct Trainer::QueuedStep {
  int64_t step = 0;
  float lr = 0.f;
  int64_t targets = 0, tokens = 0;
  double epoch = 0.0;                           // metrics.jsonl's epoch: the data's position after its batches
  std::chrono::steady_clock::time_point t0;     // its host work began
  std::chrono::steady_clock::time_point queued;  // its host work ended (on the CPU, its whole work)
  std::vector<std::pair<std::string, double>> extra;  // the objective's measures; the device ones filled at the read
  std::vector<std::string> device_names;        // the measures read from the device, in the scalars' order
  bool has_loss = false, has_norm = false;      // the scalars: [loss sum]? [norm, clip coefficient]? then the measures
  ScalarsInFlight scalars;
  // Its batches' pinned staging stays alive until the step is read: their copies to the device are
  // queued behind the previous step's work, and a freed pinned block goes back to the cache at once.
  std::vector<DeviceBatch> uploaded;
  GradNorm gn;       // distributed: the reduced norm, known when the update was queued
  bool deferred = false;  // read after the next step was queued (see run())
};

// One step's work queued on the device: its batches, forward and backward, clipping and the update.
// False when its rows have nothing to learn from (no update).
absl::StatusOr<bool> Trainer::queue_step(StepTiming& timing, int64_t& micro, int64_t& empty_steps, QueuedStep& q) {
  State& s = *s_;
  q.t0 = std::chrono::steady_clock::now();
  std::vector<Batch> batches;
  int64_t units = 0;
  for (int64_t i = 0; i < s.cfg.grad_accum; ++i) {
    batches.push_back(s.loader->next());
    // Global counts: the loss is a mean over every rank's units.
    units += s.objective->units(batches.back());
    q.targets += batches.back().target_tokens;
    q.tokens += batches.back().tokens;
  }
  s.objective->begin_step(batches);
  if (s.dist)
    for (Batch& b : batches) b = s.dist->slice(b);
  if (units == 0) {  // nothing to learn from in these rows (e.g. prompts cut off): no update
    micro += s.cfg.grad_accum;
    if (++empty_steps > std::max<int64_t>(1, s.loader->steps_per_epoch()))
      return absl::FailedPreconditionError(absl::StrCat("a whole epoch of ", s.cfg.data_path, " has no tokens to train on ",
                                                        "(every target is masked or cut off by --seq-len)"));
    return false;
  }
  empty_steps = 0;
  // The mean over the step's units of the accumulated micro-batches (SFT: token-weighted, what
  // transformers does since 4.46), summed on the device: the step reads nothing back until its end.
  if (timing.on) {
    timing.data_done = std::chrono::steady_clock::now();
    timing.start = StreamMark::record(s.device);
  }
  std::vector<DeviceBatch>& uploaded = q.uploaded;
  LOOM_ASSIGN_OR_RETURN(uploaded, upload(batches, s.device, s.model->config().vocab_size));
  Tensor loss_total;
  // The objective's measures, unit-weighted; every rank lists them all (a rank whose rows had no
  // units adds zeros), so that their sums over the ranks line up.
  std::vector<std::pair<std::string, double>>& extra = q.extra;
  extra = s.objective->metrics();
  for (const auto& [name, t] : s.objective->device_metrics()) extra.emplace_back(name, 0.0);
  for (auto& e : extra) e.second = 0.0;
  std::map<std::string, Tensor> device_extra;  // the device measures' weighted sums
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    // The global row's dropout stream (Philox blocks of 4 elements), so any world size draws the same masks.
    const int64_t row0 = s.dist ? s.dist->first_row(s.cfg.batch_size) : 0;
    for (Linear* l : s.model->linears())
      if (l->lora)
        l->lora->dropout_offset = (static_cast<uint64_t>(micro) << 36) + row0 * s.cfg.seq_len * l->lora->A.size(1) / 4;
    if (s.dist) s.dist->begin_backward(&b == &batches.back());
    ++micro;
    const int64_t mine = s.objective->units(b);
    if (mine == 0) continue;
    ag::Variable loss = s.objective->loss(*s.model, uploaded[i]);
    const float weight = static_cast<float>(mine) / static_cast<float>(units);
    ag::Variable weighted = ag::scale(loss, weight);
    loss_total = loss_total.defined() ? ops::add(loss_total, weighted.value()) : weighted.value();
    ag::backward(weighted);
    for (const std::pair<std::string, double>& mv : s.objective->metrics()) {
      auto it = std::find_if(extra.begin(), extra.end(), [&mv](const auto& e) { return e.first == mv.first; });
      if (it == extra.end()) it = extra.insert(extra.end(), {mv.first, 0.0});
      it->second += mv.second * weight;
    }
    for (const auto& [name, t] : s.objective->device_metrics()) {  // summed where they are, read at the step's end
      Tensor w = ops::scale(t.to(loss_total.device()), weight);
      auto it = device_extra.find(name);
      if (it == device_extra.end()) device_extra.emplace(name, w);
      else it->second = ops::add(it->second, w);
    }
  }
  if (timing.on) {
    timing.queued_fb = std::chrono::steady_clock::now();
    timing.fb = StreamMark::record(s.device);
  }
  q.lr = s.schedule.lr(s.cfg.lr, s.step);
  Tensor norm_coef;  // single process: [norm, clip coefficient], computed and used on the device
  if (s.dist) {  // reduce over the ranks, clip by the global norm, update (ZeRO-2: the shard)
    q.gn = s.dist->step(*s.optimizer, q.lr, s.cfg.max_grad_norm);
  } else {
    std::map<std::string, std::vector<Tensor>> grads;  // by device: a --device-map model spans several
    for (const auto& p : s.optimizer->params())
      if (p.var.grad().defined()) grads[p.var.grad().device().str()].push_back(p.var.grad());
    const float max_norm = s.cfg.max_grad_norm > 0 ? s.cfg.max_grad_norm : INFINITY;
    if (grads.size() <= 1) {
      norm_coef = ops::grad_norm_coef(grads.empty() ? std::vector<Tensor>{} : grads.begin()->second, max_norm);
    } else {  // each device's norm, read back and combined as one global norm (as torch's clip_grad_norm_)
      double sq = 0;
      for (const auto& [device, g] : grads) {
        const double n = ops::grad_norm_coef(g, INFINITY).to_doubles()[0];
        sq += n * n;
      }
      const float norm = static_cast<float>(std::sqrt(sq));
      norm_coef = Tensor::from_floats({norm, clip_coefficient(norm, max_norm)}, {2});
    }
    // The clipping factor scales the gradients inside the update, read where the update runs.
    s.optimizer->step(q.lr, norm_coef.narrow(0, 1, 1));
  }
  s.optimizer->zero_grad();
  if (timing.on) {
    timing.queued_opt = std::chrono::steady_clock::now();
    timing.opt = StreamMark::record(s.device);
  }
  q.step = ++s.step;
  // Where the data stands after this step's batches (the next step's draw moves it before this one is read).
  q.epoch = static_cast<double>(s.loader->state().epoch) +
            static_cast<double>(s.loader->state().cursor) / std::max<int64_t>(1, s.stats.examples);
  // The step's scalars start their way back (a rank whose rows had no targets adds 0 to the loss).
  if ((q.has_loss = loss_total.defined())) q.scalars.add(loss_total);
  if ((q.has_norm = norm_coef.defined())) q.scalars.add(norm_coef);
  for (auto& e : extra)
    if (auto it = device_extra.find(e.first); it != device_extra.end()) {
      q.device_names.push_back(e.first);
      q.scalars.add(it->second);
    }
  q.queued = std::chrono::steady_clock::now();
  return true;
}

// A queued step's results: its metrics line, progress line, evaluation, the divergence checks, and
// (not for a deferred step) the checkpoint or stop. Sets `stopped` when a signal or --stop-after
// ended the run here.
absl::Status Trainer::finish_step(StepTiming& timing, QueuedStep& q, std::chrono::steady_clock::time_point& last_finish,
                                  bool& line_open, bool& stopped) {
  State& s = *s_;
  const bool tty = isatty(fileno(stdout)) && (!s.dist || s.dist->root());
  const std::vector<double> v = q.scalars.values();
  size_t k = 0;
  double loss_sum = q.has_loss ? v[k++] : 0.0;
  GradNorm gn = q.gn;
  if (q.has_norm) {
    gn.norm = static_cast<float>(v[k]);
    gn.coef = static_cast<float>(v[k + 1]);
    k += 2;
  }
  std::vector<std::pair<std::string, double>> extra = std::move(q.extra);
  for (const std::string& name : q.device_names)
    for (auto& e : extra)
      if (e.first == name) e.second = v[k++];
  if (timing.on) timing.print(q.step, q.t0, std::chrono::steady_clock::now());
  if (s.dist) {
    loss_sum = s.dist->sum(loss_sum);
    std::vector<double> sums;
    for (const auto& e : extra) sums.push_back(e.second);
    s.dist->sum(sums);
    for (size_t i = 0; i < sums.size(); ++i) extra[i].second = sums[i];
  }
  s.losses.push_back(static_cast<float>(loss_sum));
  // The step's wall time: from its host work's start, or from the previous step's end when the two
  // overlapped (a deferred read: this step was queued while the previous one ran on a GPU), to its end:
  // on a GPU its read (the scalars wait for its work), on the CPU its queueing, which did all its work
  // (its read comes after the next step's queueing: timed from there, the run's last step took ~0 s
  // and printed millions of tokens/s, and a step read after an evaluation counted the evaluation).
  const auto now = std::chrono::steady_clock::now();
  const auto end = s.device.is_cpu() ? q.queued : now;
  const double dt = std::chrono::duration<double>(end - std::max(q.t0, last_finish)).count();
  last_finish = end;
  StepMetrics m;
  m.step = q.step;
  m.epoch = q.epoch;
  m.loss = loss_sum;
  m.lr = q.lr;
  m.grad_norm = gn.norm;
  m.target_tokens = q.targets;
  m.input_tokens = q.tokens;
  m.tokens_per_s = static_cast<double>(q.tokens) / dt;
  m.mem_bytes = memory_stats(s.device).peak_bytes;
  {  // a --device-map over several GPUs: each one's peak beside it, as "mem_bytes/cuda:N"
    for (const Device& d : s.model->placement().gpus())
      if (!(d == s.device)) extra.emplace_back("mem_bytes/" + d.str(), static_cast<double>(memory_stats(d).peak_bytes));
  }
  if (const int64_t reserved = pool_reserved_peak_bytes(s.device); reserved >= 0)  // the pool's share of nvidia-smi's figure
    extra.emplace_back("mem_reserved_bytes", static_cast<double>(reserved));
  if (s.checkpointing == Checkpointing::kOffload) m.host_mem_bytes = offload_stats().peak_host_bytes;
  m.extra = extra;
  if (!q.deferred && !s.eval_batches.empty() && std::isfinite(loss_sum) &&
      ((s.cfg.eval_every > 0 && q.step % s.cfg.eval_every == 0) || q.step == s.total_steps)) {
    std::vector<std::pair<std::string, double>> held_out;  // TRL's names for the held-out set: "eval_" + name
    LOOM_ASSIGN_OR_RETURN(m.eval_loss, s.evaluate(&held_out));
    for (const auto& [key, value] : held_out) m.extra.emplace_back("eval_" + key, value);
  }
  if (s.metrics) LOOM_RETURN_IF_ERROR(s.metrics->write(m));
  if (!s.cfg.quiet && s.metrics && (tty || q.step % std::max<int64_t>(1, s.cfg.log_every) == 0 || q.step == s.total_steps ||
                                    m.eval_loss)) {
    const double elapsed = std::chrono::duration<double>(now - run_start_).count();
    const double eta = elapsed / static_cast<double>(q.step - first_step_) * static_cast<double>(s.total_steps - q.step);
    std::string pref;  // preference objectives: the reward margin and accuracy beside the loss
    for (const auto& [key, value] : extra) {
      if (key == "rewards/margins") absl::StrAppendFormat(&pref, " | margin %.4f", value);
      if (key == "rewards/accuracies") absl::StrAppendFormat(&pref, " | acc %.2f", value);
    }
    std::printf("%sstep %lld/%lld | loss %.4f%s%s | lr %.3g | grad %.3g | %.0f tok/s | mem %.2f GB%s | ETA %s%s",
                tty ? "\r\033[K" : "", static_cast<long long>(q.step), static_cast<long long>(s.total_steps), loss_sum,
                pref.c_str(), m.eval_loss ? absl::StrFormat(" | eval %.4f%s", *m.eval_loss, eval_acc(m.extra)).c_str() : "",
                q.lr, gn.norm, m.tokens_per_s, static_cast<double>(m.mem_bytes) / 1e9,
                m.host_mem_bytes >= 0 ? absl::StrFormat(" (+%.2f GB host)", static_cast<double>(m.host_mem_bytes) / 1e9).c_str() : "",
                format_duration(eta).c_str(),
                tty && !m.eval_loss ? "" : "\n");  // on a terminal a line with an eval loss stays
    line_open = tty && !m.eval_loss;
    std::fflush(stdout);
  }
  // A NaN or infinite loss means the weights are no longer numbers (every rank sees the same sum):
  // end the run with an error before anything is saved over the last good checkpoint.
  if (!std::isfinite(loss_sum))
    return absl::FailedPreconditionError(absl::StrCat(
        "the loss is ", loss_sum, " at step ", q.step, ": training diverged (a learning rate too high? --lr is ",
        s.cfg.lr, "); nothing was saved for this step, the checkpoints before it are intact"));
  // So does a NaN or infinite gradient norm (the loss can stay finite while the gradients are not):
  // the update has already spread it into the weights.
  if (!std::isfinite(gn.norm))
    return absl::FailedPreconditionError(absl::StrCat(
        "the gradient norm is ", gn.norm, " at step ", q.step, " (loss ", loss_sum, "): training diverged (a learning ",
        "rate too high? --lr is ", s.cfg.lr, "); nothing was saved for this step, the checkpoints before it are intact"));
  if (q.deferred) return absl::OkStatus();  // the model has moved on: the next step's finish saves or stops
  bool stopping = g_stop.load() || (s.cfg.stop_after > 0 && s.step - first_step_ >= s.cfg.stop_after);
  if (s.dist) stopping = s.dist->any(stopping);  // a signal may reach the ranks in different steps
  if ((s.cfg.save_every > 0 && s.step % s.cfg.save_every == 0) || stopping) LOOM_RETURN_IF_ERROR(s.save_checkpoint());
  if (stopping && s.step < s.total_steps) {
    // The adapter (or model) so far at the top of --out too, as "output in ..." promises.
    LOOM_RETURN_IF_ERROR(s.save_final());
    if (!s.cfg.quiet && s.metrics) std::printf("%sstopped by signal at step %lld; checkpoint saved in %s\n", tty ? "\n" : "",
                                  static_cast<long long>(s.step), s.cfg.out_dir.c_str());
    line_open = false;
    stopped = true;
  }
  return absl::OkStatus();
}

// The loop. A step's results are read back only once the next step's work is queued behind it
// (QueuedStep::deferred), so that the device does not sit idle while the host writes metrics and
// prepares the next batch (session 48's trace of the 1B step: 1.9 ms of 195 a step). A step is read
// at once where something must see the model as that step left it or act on it before the next:
// a checkpoint, an evaluation, the last step, a stop, a distributed run (its sums are collectives),
// LOOM_STEP_TIMING. A divergence is then reported one step late: nothing is saved in between.
absl::Status Trainer::run() {
  State& s = *s_;
  StepTiming timing;
  g_stop.store(false);
  int64_t empty_steps = 0;
  bool line_open = false;  // a terminal's progress line not yet ended by a newline
  run_start_ = std::chrono::steady_clock::now();
  first_step_ = s.step;
  int64_t micro = s.step * s.cfg.grad_accum;
  auto last_finish = run_start_;
  std::optional<QueuedStep> previous;
  bool stopped = false;
  while (s.step < s.total_steps && !stopped) {
    QueuedStep q;
    absl::StatusOr<bool> queued = queue_step(timing, micro, empty_steps, q);
    if (previous) {  // read while this step runs (or before the error this step met is reported)
      const absl::Status done = finish_step(timing, *previous, last_finish, line_open, stopped);
      previous.reset();
      if (!done.ok()) return done;
    }
    if (!queued.ok()) return queued.status();
    if (!*queued) continue;
    const bool hold = s.dist || timing.on || q.step >= s.total_steps || g_stop.load() ||
                      (s.cfg.save_every > 0 && q.step % s.cfg.save_every == 0) ||
                      (s.cfg.stop_after > 0 && q.step - first_step_ >= s.cfg.stop_after) ||
                      (!s.eval_batches.empty() && s.cfg.eval_every > 0 && q.step % s.cfg.eval_every == 0);
    if (!hold) {
      q.deferred = true;
      previous.emplace(std::move(q));
      continue;
    }
    LOOM_RETURN_IF_ERROR(finish_step(timing, q, last_finish, line_open, stopped));
  }
  if (previous) LOOM_RETURN_IF_ERROR(finish_step(timing, *previous, last_finish, line_open, stopped));
  if (line_open) std::printf("\n");
  if (stopped) return absl::OkStatus();
  if (s.cfg.save_every == 0 || s.step % s.cfg.save_every != 0) LOOM_RETURN_IF_ERROR(s.save_checkpoint());
  return s.save_final();
}

}  // namespace loom
