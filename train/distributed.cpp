// The Trainer's data-parallel hooks (see distributed.h).
#include "train/distributed.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/agreement.h"
#include "dist/ddp.h"
#include "dist/zero2.h"
#include "engine/status_macros.h"
#include "engine/tensor_io.h"
#include "train/optimizer_memory.h"
#include "train/run_options.h"
#include "train/trainer.h"

namespace loom {
namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<DistContext>> DistContext::create(const std::string& mode, double timeout_s, bool cuda) {
  if (mode != "ddp" && mode != "zero2")
    return absl::InvalidArgumentError(absl::StrCat("--dist must be ddp or zero2, got '", mode, "'"));
  std::unique_ptr<DistContext> d(new DistContext());
  d->mode_ = mode;
  LOOM_ASSIGN_OR_RETURN(d->group_, dist::ProcessGroup::init({timeout_s, cuda}));
  return d;
}

DistContext::~DistContext() {
  reducer_.reset();
  group_.reset();
}

absl::Status DistContext::agree(const TrainConfig& cfg, const std::string& model_summary, const DataStats& data,
                                const DataStats& eval_data) {
  // The data file by content (tokens and examples), not path: hosts may mount it differently.
  // Every option the table marks (run_options.h), and what the paths hold: hosts may mount the files
  // differently, so the model and the data are compared by content (tokens and examples), not path.
  std::vector<std::pair<std::string, std::string>> fields = rank_agreement_fields(cfg);
  fields.emplace_back("model", model_summary);
  fields.emplace_back("data", absl::StrCat(data.examples, " examples, ", data.tokens, " tokens, ", data.target_tokens, " targets"));
  if (!cfg.eval_data_path.empty())
    fields.emplace_back("eval-data", absl::StrCat(eval_data.examples, " examples, ", eval_data.tokens, " tokens, ",
                                                  eval_data.target_tokens, " targets"));
  return dist::check_agreement(group_->cpu(), fields);
}

void DistContext::attach(optim::Optimizer& opt, bool quiet) {
  for (const auto& p : opt.params()) params_.push_back(p.var);
  dist::Communicator& comm = group_->for_device(device());
  dist::broadcast_params(comm, params_, 0);
  if (zero2()) {
    auto z = std::make_unique<dist::Zero2>(comm, opt);
    zero2_ = z.get();
    reducer_ = std::move(z);
  } else {
    reducer_ = std::make_unique<dist::DdpReducer>(comm, params_);
  }
  dist::attach_grad_hooks(*reducer_, params_);
  if (root() && !quiet) {
    const int64_t masters = opt.master_bytes();
    const double mb = 1.0 / (1 << 20);
    if (zero2_)
      std::printf("loom dist: zero2 on %d ranks (%s): optimizer state + f32 masters %.3f MiB per rank (%.3f MiB unsharded)\n",
                  world(), group_->for_device(device()).backend().c_str(), zero2_->shard_bytes() * mb,
                  zero2_->unsharded_bytes() * mb);
    else
      std::printf("loom dist: ddp on %d ranks (%s): optimizer state + f32 masters %.1f MiB per rank\n", world(),
                  group_->for_device(device()).backend().c_str(), (opt.state_bytes() + masters) * mb);
    if (opt.offloaded() && zero2_) {  // the whole shard (masters and state) lives on the host
      std::printf("%s\n", offload_summary(zero2_->shard_bytes(), zero2_->shard_bytes() - zero2_->master_bytes(),
                                          zero2_->master_bytes(), 0).c_str());
    } else if (opt.offloaded()) {
      print_offload_summary(opt);
    }
    std::fflush(stdout);
  }
}

Batch DistContext::slice(const Batch& g) const {
  if (g.pairs > 0) {  // pairs [lo, hi) of P: the block of rows that holds them (Batch::groups)
    LOOM_CHECK(g.groups == world(), "DistContext::slice: a batch of pairs in ", g.groups, " blocks over ", world(), " ranks");
    const int64_t P = g.pairs, lo = rank() * P / world(), hi = (rank() + 1) * P / world();
    const int64_t R = g.input_ids.size(0) / world(), seq = g.input_ids.size(1), first = rank() * R * seq;
    Batch b;
    b.pairs = hi - lo;
    b.tokens = g.tokens;  // progress counts the global batch
    b.pair_ids.assign(g.pair_ids.begin() + lo, g.pair_ids.begin() + hi);
    for (int64_t side = 0; side < 2; ++side)
      for (int64_t k = lo; k < hi; ++k) {
        b.seq_start.push_back(g.seq_start[side * P + k] - first);
        b.seq_len.push_back(g.seq_len[side * P + k]);
      }
    b.input_ids = g.input_ids.narrow(0, rank() * R, R).contiguous();
    b.labels = g.labels.narrow(0, rank() * R, R).contiguous();
    b.segment_ids = g.segment_ids.narrow(0, rank() * R, R).contiguous();
    b.positions = g.positions.narrow(0, first, R * seq).contiguous();
    for (int32_t l : b.labels.to_ints()) b.target_tokens += l != -100;
    return b;
  }
  const int64_t rows = g.input_ids.size(0) / world();
  LOOM_CHECK(rows * world() == g.input_ids.size(0), "DistContext::slice: ", g.input_ids.str(), " over ", world(), " ranks");
  const int64_t seq = g.input_ids.size(1), r0 = rank() * rows;
  Batch b;
  b.input_ids = g.input_ids.narrow(0, r0, rows).contiguous();
  b.labels = g.labels.narrow(0, r0, rows).contiguous();
  b.segment_ids = g.segment_ids.narrow(0, r0, rows).contiguous();
  b.positions = g.positions.narrow(0, r0 * seq, rows * seq).contiguous();
  for (int32_t l : b.labels.to_ints()) b.target_tokens += l != -100;
  b.tokens = g.tokens;  // progress counts the global batch
  if (!g.row_tokens.empty()) b.row_tokens.assign(g.row_tokens.begin() + r0, g.row_tokens.begin() + r0 + rows);
  return b;
}

void DistContext::begin_backward(bool last) { reducer_->set_sync(last); }

GradNorm DistContext::step(optim::Optimizer& opt, float lr, float max_norm) {
  reducer_->finalize();
  GradNorm gn;
  if (zero2_) {
    const dist::ClipResult c = zero2_->step(lr, max_norm);
    gn.norm = c.norm;
    gn.coef = c.coef;
  } else {
    std::vector<Tensor> grads;
    for (const auto& p : opt.params())
      if (p.var.grad().defined()) grads.push_back(p.var.grad());
    gn = clip_grad_norm(grads, max_norm > 0 ? max_norm : INFINITY);
    opt.step(lr, gn.coef);
  }
  reducer_->set_sync(true);
  return gn;
}

double DistContext::sum(double v) {
  Tensor t = Tensor::zeros({1}, DType::f64);
  *t.data<double>() = v;
  group_->cpu().all_reduce(t, dist::ReduceOp::kSum);
  group_->cpu().wait();
  return *t.data<double>();
}

void DistContext::sum(std::vector<double>& v) {
  if (v.empty()) return;
  Tensor t = Tensor::zeros({static_cast<int64_t>(v.size())}, DType::f64);
  std::copy(v.begin(), v.end(), t.data<double>());
  group_->cpu().all_reduce(t, dist::ReduceOp::kSum);
  group_->cpu().wait();
  std::copy(t.data<double>(), t.data<double>() + v.size(), v.begin());
}

bool DistContext::any(bool v) { return sum(v ? 1.0 : 0.0) > 0; }

absl::Status DistContext::save_checkpoint(const std::string& out_dir, int64_t step, TrainCheckpoint c,
                                          optim::Optimizer& opt, bool all_masters,
                                          const std::function<absl::Status(const std::string&)>& extra_files) {
  // Every rank writes its file (DDP: only rank 0 has anything to write), then rank 0 assembles
  // the folder; the ranks agree on success before anyone goes on.
  absl::Status status;
  const fs::path shards = fs::path(out_dir) / absl::StrCat(".checkpoint-", step, ".shards");
  const std::string mine = absl::StrCat("optimizer-rank", rank(), ".safetensors");
  if (zero2_ && !root()) {
    std::error_code ec;
    fs::create_directories(shards, ec);
    auto dict = zero2_->state_dict();
    status = save_tensors((shards / mine).string(), {dict.begin(), dict.end()});
  }
  bool failed = any(!status.ok());
  if (root() && !failed) {
    if (zero2_) {
      c.tensors = zero2_->state_dict();
      c.state["zero2_world"] = world();
    } else {
      c.tensors = opt.state_dict(all_masters);
    }
    status = write_train_checkpoint(out_dir, step, c, [&](const std::string& dir) -> absl::Status {
      for (int r = 1; zero2_ && r < world(); ++r) {
        const std::string f = absl::StrCat("optimizer-rank", r, ".safetensors");
        std::error_code ec;
        fs::rename(shards / f, fs::path(dir) / f, ec);
        if (ec) return absl::DataLossError(absl::StrCat("cannot move rank ", r, "'s optimizer shard ", (shards / f).string(),
                                                        " into the checkpoint: ", ec.message()));
      }
      return extra_files(dir);
    });
    std::error_code ec;
    fs::remove_all(shards, ec);
  }
  failed = any(!status.ok()) || failed;
  if (failed && status.ok())
    return absl::DataLossError(absl::StrCat("checkpoint ", step, " in ", out_dir, ": another rank failed to write its part"));
  return status;
}

absl::Status DistContext::load_zero2(const std::string& dir, const TrainCheckpoint& c) {
  LOOM_CHECK(zero2_ != nullptr, "DistContext::load_zero2 outside a ZeRO-2 run");
  const int saved_world = c.state.value("zero2_world", 1);
  std::vector<std::map<std::string, Tensor>> shards = {c.tensors};  // rank 0's, or an unsharded optimizer
  for (int r = 1; r < saved_world; ++r) {
    auto t = load_tensors((fs::path(dir) / absl::StrCat("optimizer-rank", r, ".safetensors")).string());
    if (!t.ok()) return t.status();
    shards.push_back(*std::move(t));
  }
  return zero2_->load_state_dicts(shards, dir);
}

absl::Status restore_optimizer(DistContext* dist, const std::string& dir, const TrainCheckpoint& c, optim::Optimizer& opt,
                               int64_t default_step) {
  if (dist && dist->zero2()) return dist->load_zero2(dir, c);
  const int saved_world = c.state.value("zero2_world", 0);
  if (saved_world > 1)
    return absl::FailedPreconditionError(absl::StrCat(dir, " holds a ZeRO-2 optimizer sharded over ", saved_world,
                                                      " ranks: resume it with --dist zero2 (on any number of ranks)"));
  return opt.load_state_dict(c.tensors, dir + "/optimizer.safetensors", default_step);
}

}  // namespace loom
