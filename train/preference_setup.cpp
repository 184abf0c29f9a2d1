// A preference run's setup beyond its training pairs (Trainer::create): the held-out pairs of
// --eval-data, and where the reference's scores come from (trainer_internal.h).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/safetensors.h"
#include "engine/status_macros.h"
#include "train/pair_loader.h"
#include "train/trainer_internal.h"

namespace loom {
namespace fs = std::filesystem;
namespace {

constexpr char kTableFile[] = "ref_logps.safetensors";
constexpr char kKeyName[] = "loom.reference";

// A table written for the same pairs, model, precision and kind of device, or nullopt.
std::optional<ReferenceLogps> read_table(const std::string& path, const std::string& key, int64_t pairs) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  auto f = SafetensorsFile::open(path);
  if (!f.ok()) return std::nullopt;
  auto it = f->metadata().find(kKeyName);
  if (it == f->metadata().end() || it->second != key) return std::nullopt;
  ReferenceLogps t;
  for (auto [name, dst] : {std::pair{"chosen", &t.chosen}, std::pair{"rejected", &t.rejected}}) {
    const TensorInfo* info = f->find(name);
    if (!info || info->dtype != DType::f64 || info->shape != std::vector<int64_t>{pairs}) return std::nullopt;
    const std::span<const uint8_t> b = f->bytes(*info);
    dst->resize(pairs);
    std::memcpy(dst->data(), b.data(), b.size());
  }
  return t;
}

absl::Status write_table(const std::string& path, const std::string& key, const ReferenceLogps& t) {
  auto bytes = [](const std::vector<double>& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(double));
  };
  const int64_t n = static_cast<int64_t>(t.chosen.size());
  return write_safetensors(path, {{"chosen", DType::f64, {n}, bytes(t.chosen)}, {"rejected", DType::f64, {n}, bytes(t.rejected)}},
                           {{kKeyName, key}});
}

}  // namespace

absl::Status Trainer::State::load_eval_pairs(const PreferenceDataOptions& options, int32_t pad, int64_t world,
                                             int64_t first_id) {
  PreferenceStats st;
  std::vector<PreferenceExample> held_out;
  LOOM_ASSIGN_OR_RETURN(held_out, load_preference_jsonl(cfg.eval_data_path, tokenizer, options, &st));
  eval_stats.lines = st.lines, eval_stats.examples = st.pairs, eval_stats.skipped = st.skipped;
  eval_stats.conversations = st.conversations;
  eval_stats.tokens = st.prompt_tokens + st.completion_tokens, eval_stats.target_tokens = st.completion_tokens;
  if (cfg.skip_bad_lines && st.skipped > 0 && !cfg.quiet)
    std::fprintf(stderr, "loom train: skipped %lld bad line(s) of %lld in %s\n", static_cast<long long>(st.skipped),
                 static_cast<long long>(st.lines), cfg.eval_data_path.c_str());
  // One pass in global batches (every rank evaluates its pairs of each), pair ids after the training pairs.
  eval_batches = pair_batches_in_order(held_out, cfg.batch_size * world, pad, pair_layout(cfg), world);
  for (Batch& b : eval_batches)
    for (int64_t& id : b.pair_ids) id += first_id;
  if (cfg.precompute_ref) reference_pairs.insert(reference_pairs.end(), held_out.begin(), held_out.end());
  return absl::OkStatus();
}

absl::Status Trainer::State::prepare_reference(const LoadOptions& load, bool resumed) {
  if (!objective->uses_reference()) return absl::OkStatus();
  const bool talk = !cfg.quiet && (!dist || dist->root());
  if (!cfg.precompute_ref) {
    if (!cfg.full) return absl::OkStatus();  // the model with its adapters off
    // Full fine-tuning changes every weight: the reference is a frozen copy of the starting model.
    LOOM_ASSIGN_OR_RETURN(reference_model, CausalLM::load(cfg.model_dir, load));
    objective->set_reference_model(reference_model.get());
    if (talk) std::printf("reference: a frozen copy of %s (--precompute-ref scores the pairs once instead)\n",
                          cfg.model_dir.c_str());
    return absl::OkStatus();
  }
  const int64_t n = static_cast<int64_t>(reference_pairs.size());
  const std::string path = (fs::path(cfg.out_dir) / kTableFile).string();
  const std::string key = nlohmann::json{{"pairs", fingerprint(pair_documents(reference_pairs))},
                                         {"model", model->config().summary()},
                                         {"dtype", std::string(name(dtype))},
                                         {"device", device.is_cuda() ? "cuda" : "cpu"}}
                              .dump();
  std::optional<ReferenceLogps> table = read_table(path, key, n);
  if (table) {
    if (talk) std::printf("reference: the scores of %lld pairs read from %s\n", static_cast<long long>(n), path.c_str());
  } else {
    // The reference is the starting model: a fresh run's model with its adapters off (--full: the
    // model itself, not trained yet); a resumed --full run's weights have moved, so the start is
    // loaded again for the pass and let go after it.
    std::unique_ptr<CausalLM> start;
    if (cfg.full && resumed) {
      LOOM_ASSIGN_OR_RETURN(start, CausalLM::load(cfg.model_dir, load));
    }
    const auto t0 = std::chrono::steady_clock::now();
    ReferenceLogps scored;
    LOOM_ASSIGN_OR_RETURN(scored, score_reference(*model, start.get(), pair_batches_in_order(reference_pairs, cfg.batch_size,
                                                                                          static_cast<int32_t>(tokenizer.eos_id().value_or(0)),
                                                                                          pair_layout(cfg)),
                                                  n, device, dist.get()));
    table = std::move(scored);
    if (!dist || dist->root()) LOOM_RETURN_IF_ERROR(write_table(path, key, *table));
    if (talk)
      std::printf("reference: scored %lld pairs in %.1f s, kept in %s\n", static_cast<long long>(n),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), path.c_str());
  }
  objective->set_reference_logps(std::make_shared<const ReferenceLogps>(*std::move(table)));
  std::vector<PreferenceExample>().swap(reference_pairs);
  return absl::OkStatus();
}

}  // namespace loom
