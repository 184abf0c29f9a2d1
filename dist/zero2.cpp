// ZeRO-2 (see zero2.h): bucketed reduce-scatter into the owners' shards, a sharded step through the
// Optimizer's UpdateRule, all-gather of the new weights, and re-sharding checkpoints.
#include "dist/zero2.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/ops.h"
#include "kernels/grad_norm.h"

namespace loom::dist {

Zero2::Zero2(Communicator& comm, optim::Optimizer& opt, int64_t bucket_bytes) : comm_(comm), opt_(opt) {
  LOOM_CHECK(opt.sharded(), "Zero2: the Optimizer must be constructed with sharded = true");
  const auto& params = opt.params();
  LOOM_CHECK(!params.empty(), "Zero2: no trainable parameters");
  const int n = static_cast<int>(params.size());
  dtype_ = params[0].var.dtype();
  device_ = params[0].var.device();
  std::vector<int64_t> numels;
  for (int i = n - 1; i >= 0; --i) {
    const Tensor& v = params[i].var.value();
    LOOM_CHECK(v.dtype() == dtype_ && v.device() == device_, "Zero2: parameter ", params[i].name, " is ", v.str(),
               ", the others ", name(dtype_), " on ", device_.str(), ": one flat buffer needs one dtype and device");
    order_.push_back(i);
    numels.push_back(v.numel());
  }
  position_.assign(n, 0);
  for (int k = 0; k < n; ++k) position_[order_[k]] = k;
  layout_ = make_shard_layout(numels, opt.rule().alignment(), comm.world_size());
  steps_.assign(n, 0);

  const int me = comm.rank();
  const int64_t base = me * layout_.shard;
  // Offloaded, masters and state go to pinned host memory; gradients are reduced on the device.
  const bool host = opt.offloaded();
  const Device state_device = host ? Device::cpu() : device_;
  master_ = host ? optim::pinned_copy(Tensor::zeros({layout_.shard}, DType::f32), DType::f32)
                 : Tensor::zeros({layout_.shard}, DType::f32, device_);
  grad_ = Tensor::zeros({layout_.shard}, DType::f32, device_);
  for (const ShardPiece& sp : layout_.pieces(me)) {
    Piece p;
    p.at = sp;
    p.param = order_[sp.param];
    const int64_t len = sp.end - sp.begin;
    Tensor src = params[p.param].var.value().reshape({-1}).narrow(0, sp.begin, len);
    master_.narrow(0, sp.flat - base, len).copy_(src);
    for (auto& [state_name, t] : opt.rule().init_state_range(len, numels[sp.param], state_device)) {
      p.state_names.push_back(state_name);
      p.state.push_back(host ? optim::pinned_copy(t, t.dtype()) : std::move(t));
    }
    pieces_.push_back(std::move(p));
  }
  // Buckets: runs of whole parameters in flat order, each about bucket_bytes; the last reaches the
  // padded end.
  bucket_of_.assign(n, 0);
  for (int k = 0; k < n; ++k) {
    const int64_t end = k + 1 < n ? layout_.offsets[k + 1] : layout_.total();
    if (buckets_.empty() || bytes_for(dtype_, buckets_.back().hi - buckets_.back().lo) >= bucket_bytes) {
      buckets_.emplace_back();
      buckets_.back().first = k;
      buckets_.back().lo = k == 0 ? 0 : layout_.offsets[k];
    }
    Bucket& b = buckets_.back();
    b.last = k + 1;
    b.hi = end;
    bucket_of_[k] = static_cast<int>(buckets_.size()) - 1;
  }
  arrived_.assign(n, false);
}

void Zero2::add(int index, Tensor& grad) {
  LOOM_CHECK(index >= 0 && index < static_cast<int>(position_.size()), "Zero2::add: no parameter ", index);
  const int k = position_[index];
  LOOM_CHECK(!arrived_[k], "Zero2::add: parameter ", opt_.params()[index].name, " reported twice in one step");
  Bucket& b = buckets_[bucket_of_[k]];
  if (!b.buffer.defined()) b.buffer = Tensor::zeros({b.hi - b.lo}, dtype_, device_);  // padding stays zero
  b.buffer.narrow(0, layout_.offsets[k] - b.lo, layout_.numels[k]).view(grad.shape()).copy_(grad);
  grad = Tensor();  // the owner keeps the reduced shard; the full gradient is not needed any more
  arrived_[k] = true;
  ++b.ready;
  launch_ready();
}

void Zero2::launch(Bucket& b) {
  const int me = comm_.rank(), world = comm_.world_size();
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = layout_.overlap(r, b.lo, b.hi);
  const int64_t mine = counts[me];
  const int64_t at = std::max(b.lo, me * layout_.shard) - me * layout_.shard;
  Tensor out;
  if (mine == 0) {
    out = Tensor::empty({1}, dtype_, device_).narrow(0, 0, 0);
  } else if (dtype_ == DType::f32) {
    out = grad_.narrow(0, at, mine);
  } else {
    out = Tensor::empty({mine}, dtype_, device_);
    b.received = out;
    b.dst = grad_.narrow(0, at, mine);
  }
  comm_.reduce_scatter(b.buffer, out, ReduceOp::kSum, counts);
  b.ticket = comm_.issued();
  b.buffer = Tensor();  // the communicator keeps it until the collective is waited for
}

void Zero2::launch_ready() {
  auto complete = [&](size_t i) {
    return i < buckets_.size() && buckets_[i].ready == buckets_[i].last - buckets_[i].first;
  };
  if (!complete(next_)) return;
  // Before launching, settle what earlier calls launched beyond the window: those collectives have
  // had backward's compute to run behind. Buckets that become complete together (a late parameter)
  // all launch now, and none of them is waited for here.
  if (next_ + 1 > settled_ + kBucketsInFlight) settle(next_ + 1 - kBucketsInFlight);
  while (complete(next_)) launch(buckets_[next_++]);
}

void Zero2::settle(size_t end) {
  if (end <= settled_) return;
  comm_.wait_until(buckets_[end - 1].ticket);
  for (; settled_ < end; ++settled_) {
    Bucket& b = buckets_[settled_];
    if (b.received.defined()) b.dst.copy_(b.received);
    b.received = b.dst = Tensor();
  }
}

void Zero2::finalize() {
  for (size_t bi = next_; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    for (int k = b.first; k < b.last; ++k) {
      if (arrived_[k]) continue;
      // No gradient this backward on this rank: earlier micro-steps' or zeros.
      ag::GradCell& cell = *opt_.params()[order_[k]].var.cell();
      if (!b.buffer.defined()) b.buffer = Tensor::zeros({b.hi - b.lo}, dtype_, device_);
      if (cell.grad.defined())
        b.buffer.narrow(0, layout_.offsets[k] - b.lo, layout_.numels[k]).view(cell.grad.shape()).copy_(cell.grad);
      cell.grad = Tensor();
      arrived_[k] = true;
      ++b.ready;
    }
  }
  launch_ready();
  settle(buckets_.size());
  comm_.wait();
  for (Bucket& b : buckets_) b.ready = 0;
  arrived_.assign(arrived_.size(), false);
  next_ = settled_ = 0;
}

ClipResult Zero2::step(float lr, float max_norm) {
  ClipResult c;
  Tensor sq = ops::sum_squares(grad_).to(DType::f32).reshape({1}).contiguous();  // padding is zero
  comm_.all_reduce(sq, ReduceOp::kSum);
  comm_.wait();
  c.norm = std::sqrt(sq.item());
  if (max_norm > 0) c.coef = clip_coefficient(c.norm, max_norm);
  const int64_t base = comm_.rank() * layout_.shard;
  std::vector<optim::HostRange> offloaded;
  // The updated shard in the parameters' dtype, only for the all-gather (not kept between steps).
  Tensor rounded = Tensor::zeros({layout_.shard}, dtype_, device_);
  for (Piece& p : pieces_) {
    const optim::ParamGroup& g = opt_.groups()[opt_.params()[p.param].group];
    const int64_t off = p.at.flat - base, len = p.at.end - p.at.begin;
    optim::StepArgs a;
    a.lr = lr * g.lr_scale;
    a.weight_decay = g.weight_decay;
    a.grad_scale = c.coef;
    a.step = steps_[p.param] + 1;
    Tensor master = master_.narrow(0, off, len);
    Tensor compute = rounded.narrow(0, off, len);
    if (opt_.offloaded())
      offloaded.push_back({master, &p.state, grad_.narrow(0, off, len), compute, a});
    else
      opt_.rule().update(master, grad_.narrow(0, off, len), p.state, a, &compute);
  }
  if (opt_.offloaded()) host_.run(opt_.rule(), offloaded);
  for (int64_t& s : steps_) ++s;
  Tensor gathered = Tensor::empty({layout_.total()}, dtype_, device_);
  comm_.all_gather(rounded, gathered);
  comm_.wait();
  for (size_t k = 0; k < order_.size(); ++k) {
    Tensor value = opt_.params()[order_[k]].var.value();
    value.copy_(gathered.narrow(0, layout_.offsets[k], layout_.numels[k]).view(value.shape()));
  }
  ops::fill_(grad_, 0.f);
  return c;
}

int64_t Zero2::shard_bytes() const {
  int64_t n = master_.nbytes();
  for (auto& [name, t] : opt_.rule().shared_state()) n += t.nbytes();
  for (const Piece& p : pieces_)
    for (const Tensor& t : p.state) n += t.nbytes();
  return n;
}

int64_t Zero2::unsharded_bytes() const {
  int64_t n = 0;
  for (auto& [name, t] : opt_.rule().shared_state()) n += t.nbytes();
  for (size_t k = 0; k < order_.size(); ++k) {
    if (dtype_ != DType::f32) n += layout_.numels[k] * 4;  // a separate f32 master
    // The rule's state per element, measured on a piece of up to 4096 elements (16 8-bit blocks).
    for (auto& [name, t] : opt_.rule().init_state_range(std::min<int64_t>(layout_.numels[k], 4096), layout_.numels[k],
                                                         Device::cpu()))
      n += static_cast<int64_t>(static_cast<double>(t.nbytes()) * layout_.numels[k] /
                                std::max<int64_t>(1, std::min<int64_t>(layout_.numels[k], 4096)));
  }
  return n;
}

std::map<std::string, Tensor> Zero2::state_dict() const {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : opt_.rule().shared_state()) out[name] = t;
  const int64_t base = comm_.rank() * layout_.shard;
  for (const Piece& p : pieces_) {
    const std::string& pname = opt_.params()[p.param].name;
    for (size_t i = 0; i < p.state.size(); ++i) out[p.state_names[i] + "." + pname] = p.state[i];
    out["master." + pname] = master_.narrow(0, p.at.flat - base, p.at.end - p.at.begin);
  }
  for (size_t i = 0; i < steps_.size(); ++i) {
    Tensor step = Tensor::zeros({1}, DType::i64);
    *step.data<int64_t>() = steps_[i];
    out["step." + opt_.params()[i].name] = step;
  }
  return out;
}

absl::Status Zero2::load_state_dicts(const std::vector<std::map<std::string, Tensor>>& ranks, const std::string& where) {
  if (ranks.empty()) return absl::DataLossError(absl::StrCat(where, ": no optimizer shards"));
  if (absl::Status s = opt_.rule().load_shared_state(ranks[0], where); !s.ok()) return s;
  const int old_world = static_cast<int>(ranks.size());
  const ShardLayout old = make_shard_layout(layout_.numels, layout_.alignment, old_world);
  const int64_t a = layout_.alignment;
  const auto& params = opt_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = ranks[0].find("step." + params[i].name);
    if (it == ranks[0].end() || it->second.numel() != 1 || it->second.dtype() != DType::i64)
      return absl::DataLossError(absl::StrCat(where, ": missing optimizer tensor step.", params[i].name));
    steps_[i] = *it->second.contiguous().data<int64_t>();
  }
  // Copies [lo, hi) of the parameter from src (covering [sb, se)) into dst (covering [db, de)),
  // per element or, for state kept per block of `a`, per block.
  auto copy_range = [&](const Tensor& src, int64_t sb, int64_t se, Tensor dst, int64_t db, int64_t de, int64_t lo,
                        int64_t hi, const std::string& key) -> absl::Status {
    const bool dst_elem = dst.numel() == de - db;
    const bool src_elem = src.numel() == se - sb;
    if (dst_elem != src_elem || src.dtype() != dst.dtype())
      return absl::DataLossError(absl::StrCat(where, ": optimizer tensor ", key, " is ", src.str(), ", expected ",
                                              dst_elem ? "one value per element" : "one value per block", " of ",
                                              std::string(name(dst.dtype()))));
    Tensor s = src.reshape({-1});
    if (dst_elem) {
      dst.narrow(0, lo - db, hi - lo).copy_(s.narrow(0, lo - sb, hi - lo));
    } else {
      const int64_t blocks = (hi - lo + a - 1) / a;
      dst.narrow(0, (lo - db) / a, blocks).copy_(s.narrow(0, (lo - sb) / a, blocks));
    }
    return absl::OkStatus();
  };
  const int64_t base = comm_.rank() * layout_.shard;
  Tensor rounded = Tensor::zeros({layout_.shard}, dtype_, device_);  // the masters rounded, for the all-gather
  for (Piece& p : pieces_) {
    const std::string& pname = params[p.param].name;
    const int k = p.at.param;
    int64_t covered = 0;
    for (int q = 0; q < old_world; ++q) {
      for (const ShardPiece& op : old.pieces(q)) {
        if (op.param != k) continue;
        const int64_t lo = std::max(op.begin, p.at.begin), hi = std::min(op.end, p.at.end);
        if (lo >= hi) continue;
        covered += hi - lo;
        for (size_t i = 0; i < p.state.size(); ++i) {
          const std::string key = p.state_names[i] + "." + pname;
          auto st = ranks[q].find(key);
          if (st == ranks[q].end())
            return absl::DataLossError(absl::StrCat(where, ": rank ", q, "'s shard lacks optimizer tensor ", key));
          if (absl::Status s = copy_range(st->second, op.begin, op.end, p.state[i], p.at.begin, p.at.end, lo, hi, key);
              !s.ok())
            return s;
        }
        Tensor master = master_.narrow(0, p.at.flat - base, p.at.end - p.at.begin);
        auto m = ranks[q].find("master." + pname);
        if (m != ranks[q].end()) {
          if (absl::Status s = copy_range(m->second, op.begin, op.end, master, p.at.begin, p.at.end, lo, hi,
                                          "master." + pname);
              !s.ok())
            return s;
        } else if (dtype_ == DType::f32) {
          // Saved without masters (LoRA): the parameter itself, already loaded, is the master.
          master.narrow(0, lo - p.at.begin, hi - lo).copy_(params[p.param].var.value().reshape({-1}).narrow(0, lo, hi - lo));
        } else {
          return absl::DataLossError(absl::StrCat(where, ": missing optimizer tensor master.", pname));
        }
      }
    }
    if (covered != p.at.end - p.at.begin)
      return absl::DataLossError(absl::StrCat(where, ": the ", old_world, " shards cover ", covered, " of the ",
                                              p.at.end - p.at.begin, " elements of ", pname, " this rank needs"));
    rounded.narrow(0, p.at.flat - base, p.at.end - p.at.begin).copy_(master_.narrow(0, p.at.flat - base, p.at.end - p.at.begin));
  }
  // Every rank now holds its masters; the parameters become the masters rounded once.
  Tensor gathered = Tensor::empty({layout_.total()}, dtype_, device_);
  comm_.all_gather(rounded, gathered);
  comm_.wait();
  for (size_t k = 0; k < order_.size(); ++k) {
    Tensor value = params[order_[k]].var.value();
    value.copy_(gathered.narrow(0, layout_.offsets[k], layout_.numels[k]).view(value.shape()));
  }
  return absl::OkStatus();
}

}  // namespace loom::dist
