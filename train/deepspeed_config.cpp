// See deepspeed_config.h.
#include "train/deepspeed_config.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/json_file.h"

namespace loom {
namespace {

using json = nlohmann::json;

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// DeepSpeed writes sizes as numbers, 2e8 included: an integer when it is one.
std::string number_text(const json& v) {
  const double d = v.get<double>();
  if (std::floor(d) == d && std::abs(d) < 9e15) return absl::StrCat(static_cast<int64_t>(d));
  return absl::StrFormat("%.9g", d);
}

class Reader {
 public:
  Reader(std::string path, DeepSpeedTranslation* out) : path_(std::move(path)), out_(out) {}
  // The value at a.b.c, marked as read; null when absent.
  const json* at(const json& root, const std::vector<std::string>& keys) {
    const json* v = &root;
    std::string dotted;
    for (const std::string& k : keys) {
      if (!v->is_object() || !v->contains(k)) return nullptr;
      v = &(*v)[k];
      dotted += (dotted.empty() ? "" : ".") + k;
      read_.insert(dotted);
    }
    return v;
  }
  absl::Status bad(const std::string& key, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": \"", key, "\": ", why));
  }
  // A positive integer, "auto" (nullopt), or an error naming the key.
  absl::StatusOr<std::optional<int64_t>> count(const json& root, const std::vector<std::string>& keys) {
    const json* v = at(root, keys);
    if (!v || is_auto(*v)) return std::optional<int64_t>();
    if (!v->is_number() || v->get<double>() < 1 || std::floor(v->get<double>()) != v->get<double>())
      return bad(absl::StrJoin(keys, "."), absl::StrCat("expected a positive integer or \"auto\", got ", v->dump()));
    return std::optional<int64_t>(static_cast<int64_t>(v->get<double>()));
  }
  // A number or "auto" (false); an error otherwise.
  absl::StatusOr<bool> number(const json& root, const std::vector<std::string>& keys, const std::string& flag) {
    const json* v = at(root, keys);
    if (!v || is_auto(*v)) return false;
    if (!v->is_number()) return bad(absl::StrJoin(keys, "."), absl::StrCat("expected a number or \"auto\", got ", v->dump()));
    flag_(flag, number_text(*v));
    return true;
  }
  void flag_(const std::string& name, const std::string& value) {
    out_->flags.push_back(value.empty() ? "--" + name : absl::StrCat("--", name, "=", value));
  }
  void note(const std::string& text) { out_->notes.push_back(text); }
  // Every key of the file, dotted, that nothing read.
  void list_unread(const json& v, const std::string& prefix, std::vector<std::string>* out) const {
    for (const auto& [k, sub] : v.items()) {
      const std::string dotted = prefix.empty() ? k : prefix + "." + k;
      if (!read_.count(dotted)) out->push_back(dotted);
      else if (sub.is_object()) list_unread(sub, dotted, out);
    }
  }

 private:
  std::string path_;
  DeepSpeedTranslation* out_;
  std::set<std::string> read_;
};

}  // namespace

absl::StatusOr<DeepSpeedTranslation> read_deepspeed_config(const std::string& path, int64_t world) {
  auto file = read_json_file(path);
  if (!file.ok()) return file.status();
  const json& j = *file;
  DeepSpeedTranslation t;
  Reader r(path, &t);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": a DeepSpeed config is a JSON object"));

  // ZeRO.
  if (const json* stage = r.at(j, {"zero_optimization", "stage"})) {
    if (!stage->is_number_integer()) return r.bad("zero_optimization.stage", absl::StrCat("expected 0 to 3, got ", stage->dump()));
    const int64_t s = stage->get<int64_t>();
    if (s == 3)
      return r.bad("zero_optimization.stage",
                   "ZeRO-3 shards the parameters, which Loom does not: use stage 2 (--dist zero2 shards the gradients "
                   "and optimizer state), with --qlora or --device-map for a model larger than one GPU");
    if (s < 0 || s > 3) return r.bad("zero_optimization.stage", absl::StrCat("expected 0 to 3, got ", s));
    if (world > 1) r.flag_("dist", s == 0 ? "ddp" : "zero2");
    else r.note(absl::StrCat("zero_optimization.stage ", s, ": one process, so no data parallelism (launch with mpirun -np N)"));
    if (s == 1 && world > 1) r.note("zero_optimization.stage 1 runs as Loom's zero2, which shards the gradients as well: the same updates, less memory");
  }
  if (const json* dev = r.at(j, {"zero_optimization", "offload_optimizer", "device"})) {
    const std::string d = dev->is_string() ? dev->get<std::string>() : dev->dump();
    if (d == "cpu") r.flag_("offload-optimizer", "");
    else if (d == "nvme") return r.bad("zero_optimization.offload_optimizer.device", "Loom offloads the optimizer to host memory (\"cpu\"), not to NVMe");
    else if (d != "none") return r.bad("zero_optimization.offload_optimizer.device", absl::StrCat("expected cpu or none, got ", d));
  }
  r.at(j, {"zero_optimization", "offload_optimizer", "pin_memory"});  // Loom's host copies are always pinned
  if (const json* dev = r.at(j, {"zero_optimization", "offload_param", "device"}))
    if (!(dev->is_string() && dev->get<std::string>() == "none"))
      return r.bad("zero_optimization.offload_param", "parameter offload belongs to ZeRO-3; Loom streams layers from host memory with --device-map instead");
  std::vector<std::string> own;
  for (const char* k : {"reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients", "reduce_scatter",
                        "allgather_partitions", "round_robin_gradients"})
    if (r.at(j, {"zero_optimization", k})) own.push_back(k);
  if (!own.empty())
    r.note(absl::StrCat("zero_optimization ", absl::StrJoin(own, ", "), ": Loom's own (it reduces gradients in buckets of its ",
                        "choosing while backward runs, always)"));

  // Batch sizes: train_batch_size = micro x accumulation x ranks.
  absl::StatusOr<std::optional<int64_t>> micro = r.count(j, {"train_micro_batch_size_per_gpu"}),
                                         accum = r.count(j, {"gradient_accumulation_steps"}),
                                         total = r.count(j, {"train_batch_size"});
  for (const auto* v : {&micro, &accum, &total})
    if (!v->ok()) return v->status();
  std::optional<int64_t> m = *micro, a = *accum;
  if (total->has_value()) {
    const int64_t tb = **total;
    if (m && !a) {
      if (tb % (*m * world)) return r.bad("train_batch_size", absl::StrCat(tb, " is not a multiple of ", *m, " x ", world, " ranks"));
      a = tb / (*m * world);
    } else if (a && !m) {
      if (tb % (*a * world)) return r.bad("train_batch_size", absl::StrCat(tb, " is not a multiple of ", *a, " x ", world, " ranks"));
      m = tb / (*a * world);
    } else if (m && a && *m * *a * world != tb) {
      return r.bad("train_batch_size", absl::StrCat(tb, " is not train_micro_batch_size_per_gpu ", *m, " x gradient_accumulation_steps ",
                                                    *a, " x ", world, " ranks (", *m * *a * world, ")"));
    } else if (!m && !a) {
      r.note("train_batch_size without its micro-batch or accumulation: Loom's --batch-size and --grad-accum decide");
    }
  }
  if (m) r.flag_("batch-size", absl::StrCat(*m));
  if (a) r.flag_("grad-accum", absl::StrCat(*a));
  if (auto s = r.number(j, {"gradient_clipping"}, "max-grad-norm"); !s.ok()) return s.status();

  // Precision.
  auto enabled = [&](const char* section) -> absl::StatusOr<std::optional<bool>> {
    const json* v = r.at(j, {section, "enabled"});
    if (!v || is_auto(*v)) return std::optional<bool>();
    if (!v->is_boolean()) return r.bad(absl::StrCat(section, ".enabled"), absl::StrCat("expected true, false or \"auto\", got ", v->dump()));
    return std::optional<bool>(v->get<bool>());
  };
  auto bf16 = enabled("bf16"), fp16 = enabled("fp16");
  if (!bf16.ok()) return bf16.status();
  if (!fp16.ok()) return fp16.status();
  if ((*bf16 && **bf16) || (*fp16 && **fp16)) r.flag_("dtype", "bf16");
  else if (*bf16 && *fp16 && !**bf16 && !**fp16) r.flag_("dtype", "f32");
  if (*fp16 && **fp16) r.note("fp16.enabled: Loom computes in bf16 (the range of f32: no loss scaling)");
  for (const char* k : {"loss_scale", "loss_scale_window", "initial_scale_power", "hysteresis", "min_loss_scale", "auto_cast"})
    r.at(j, {"fp16", k});  // bf16 needs no loss scale

  // Optimizer and schedule.
  if (const json* type = r.at(j, {"optimizer", "type"})) {
    const std::string ty = type->is_string() ? type->get<std::string>() : type->dump();
    if (ty != "AdamW" && ty != "Adam" && ty != "adamw" && ty != "adam")
      return r.bad("optimizer.type", absl::StrCat(ty, ": Loom trains with AdamW (--optim adamw or adamw8bit)"));
  }
  if (auto s = r.number(j, {"optimizer", "params", "lr"}, "lr"); !s.ok()) return s.status();
  if (auto s = r.number(j, {"optimizer", "params", "weight_decay"}, "weight-decay"); !s.ok()) return s.status();
  if (const json* betas = r.at(j, {"optimizer", "params", "betas"}); betas && !is_auto(*betas) && *betas != json({0.9, 0.999}))
    r.note(absl::StrCat("optimizer.params.betas ", betas->dump(), ": Loom's AdamW uses (0.9, 0.999)"));
  if (const json* eps = r.at(j, {"optimizer", "params", "eps"}); eps && !is_auto(*eps) && !(eps->is_number() && eps->get<double>() == 1e-8))
    r.note(absl::StrCat("optimizer.params.eps ", eps->dump(), ": Loom's AdamW uses 1e-8"));
  if (const json* type = r.at(j, {"scheduler", "type"})) {
    const std::string ty = type->is_string() ? type->get<std::string>() : type->dump();
    if (ty == "WarmupLR") r.flag_("schedule", "constant");
    else if (ty == "WarmupDecayLR") r.flag_("schedule", "linear");
    else if (ty == "WarmupCosineLR") r.flag_("schedule", "cosine");
    else return r.bad("scheduler.type", absl::StrCat(ty, ": Loom has WarmupLR, WarmupDecayLR and WarmupCosineLR (constant, linear, cosine)"));
  }
  if (auto s = r.number(j, {"scheduler", "params", "warmup_num_steps"}, "warmup"); !s.ok()) return s.status();
  if (auto s = r.number(j, {"scheduler", "params", "warmup_max_lr"}, "lr"); !s.ok()) return s.status();
  if (const json* v = r.at(j, {"scheduler", "params", "warmup_min_lr"}); v && !is_auto(*v) && !(v->is_number() && v->get<double>() == 0))
    r.note(absl::StrCat("scheduler.params.warmup_min_lr ", v->dump(), ": Loom's warmup starts from 0"));
  r.at(j, {"scheduler", "params", "total_num_steps"});  // Loom's own: --max-steps / --epochs
  r.at(j, {"scheduler", "params", "warmup_type"});

  std::vector<std::string> unread;
  r.list_unread(j, "", &unread);
  if (!unread.empty()) r.note(absl::StrCat("not used by Loom: ", absl::StrJoin(unread, ", ")));
  return t;
}

}  // namespace loom
