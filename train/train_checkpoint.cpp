// Training checkpoints on disk (see train_checkpoint.h).
#include "train/train_checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "engine/safetensors.h"
#include "engine/tensor_io.h"
#include "models/finite_check.h"

namespace loom {
namespace fs = std::filesystem;

namespace {

// Flushes a file or folder to the disk so that a rename after it never exposes half a checkpoint.
absl::Status fsync_path(const fs::path& p) {
  const int fd = open(p.c_str(), O_RDONLY);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", p.string(), " to sync it"));
  const int rc = fsync(fd);
  close(fd);
  return rc == 0 ? absl::OkStatus() : absl::DataLossError(absl::StrCat("fsync of ", p.string(), " failed"));
}

absl::Status write_checkpoint_files(const fs::path& tmp, const TrainCheckpoint& ckpt,
                                    const std::function<absl::Status(const std::string& dir)>& extra_files);

constexpr const char* kChecksums = "checksums.json";

// A 64-bit checksum of a file's bytes (8-byte words through a multiply-xorshift mix, then the
// tail and the length): fast enough for multi-gigabyte optimizer states, and any flipped bit
// changes it.
absl::StatusOr<std::string> file_checksum(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(p.string(), ": cannot open: ", std::strerror(errno)));
  uint64_t h = 0x9E3779B97F4A7C15ull, length = 0;
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const size_t n = static_cast<size_t>(f.gcount());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, buf.data() + i, 8);
      h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    for (; i < n; ++i) h = (h ^ static_cast<unsigned char>(buf[i])) * 0x94D049BB133111EBull;
    length += n;
  }
  h = (h ^ length) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(hex);
}

// Checks every file listed in the folder's checksums.json. Without one nothing can be verified (a
// deleted checksums.json must not turn verification off): DataLoss saying how to resume unverified.
absl::Status verify_checksums(const fs::path& dir) {
  std::ifstream f(dir / kChecksums);
  if (!f)
    return absl::DataLossError(absl::StrCat((dir / kChecksums).string(), " is missing, so the checkpoint cannot be ",
                                            "verified (deleted, or written by a Loom from before checksums); ",
                                            "--no-verify resumes from it unverified"));
  const nlohmann::json sums = nlohmann::json::parse(f, nullptr, false);
  if (sums.is_discarded() || !sums.is_object())
    return absl::DataLossError(absl::StrCat((dir / kChecksums).string(), ": not a JSON object"));
  for (const auto& [name, want] : sums.items()) {
    auto got = file_checksum(dir / name);
    if (!got.ok()) return absl::DataLossError(absl::StrCat((dir / name).string(), " is missing"));
    if (!want.is_string() || *got != want.get<std::string>())
      return absl::DataLossError(absl::StrCat((dir / name).string(), ": checksum mismatch (the file is corrupted)"));
  }
  return absl::OkStatus();
}

// The checkpoint-<step> folders of an output folder, newest first.
std::vector<std::pair<int64_t, fs::path>> checkpoints_of(const std::string& out_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string n = e.path().filename().string();
    int64_t step = 0;
    if (n.rfind("checkpoint-", 0) == 0 && absl::SimpleAtoi(n.substr(11), &step) && e.is_directory(ec))
      out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// trainer_state.json's counters: whole numbers in [0, kMaxCheckpointCount] (steps with no target
// token take batches without a step, so the epoch has no tighter bound from the step); zero2_world
// a plausible rank count.
absl::Status check_counters(const nlohmann::json& state, const std::string& state_path) {
  for (const char* key : {"step", "total_steps", "epoch", "cursor", "offset"}) {
    const auto it = state.find(key);
    if (it == state.end()) continue;
    if (!(it->is_number_integer() && it->get<int64_t>() >= 0))
      return absl::DataLossError(
          absl::StrCat(state_path, ": \"", key, "\" must be a whole number >= 0, got ", it->dump()));
    if (it->is_number_unsigned() ? it->get<uint64_t>() > uint64_t(kMaxCheckpointCount) : it->get<int64_t>() > kMaxCheckpointCount)
      return absl::DataLossError(absl::StrCat(state_path, ": \"", key, "\" is ", it->dump(), ", beyond any real run (at most ",
                                              kMaxCheckpointCount, "): the file was damaged or tampered with"));
  }
  const auto world = state.find("zero2_world");
  if (world != state.end() && !(world->is_number_integer() && world->get<int64_t>() >= 1 && world->get<int64_t>() <= 65536))
    return absl::DataLossError(
        absl::StrCat(state_path, ": \"zero2_world\" must be a rank count in [1, 65536], got ", world->dump()));
  return absl::OkStatus();
}

// What AdamW and 8-bit AdamW state can hold (names "<kind>.<param>" as Optimizer::state_dict and
// dist::Zero2 write them): float tensors finite; second moments (exp_avg_sq, the 8-bit rule's
// state2 when kept in f32) and the 8-bit block maxima and unsigned code book non-negative;
// per-parameter steps in [0, the run's step] (a parameter is updated at most once a step).
absl::Status check_optimizer_tensor(const std::string& name, const Tensor& t, int64_t max_step, const std::string& file) {
  const std::string kind = name.substr(0, name.find('.'));
  if (kind == "step") {
    if (t.dtype() != DType::i64 || t.numel() != 1)
      return absl::DataLossError(absl::StrCat(file, ": tensor '", name, "' is ", t.str(), ", expected i64[1]"));
    const int64_t s = *t.contiguous().data<int64_t>();
    if (s < 0 || s > max_step)
      return absl::DataLossError(absl::StrCat(file, ": tensor '", name, "' (the parameter's step count) is ", s,
                                              ", expected 0 to the run's step ", max_step));
    return absl::OkStatus();
  }
  if (!is_float(t.dtype())) return absl::OkStatus();  // 8-bit codes: any byte is a valid code
  if (absl::Status s = check_finite(t, file, name, " (a damaged checkpoint, or one saved from a diverged run)"); !s.ok())
    return absl::DataLossError(s.message());
  const bool non_negative = kind == "exp_avg_sq" || kind == "state2" || kind == "absmax1" || kind == "absmax2" ||
                            kind == "qmap2";
  if (!non_negative) return absl::OkStatus();
  // In place for f32 (what the rules store; a full fine-tune's exp_avg_sq is gigabytes), else a copy.
  const Tensor f = t.dtype() == DType::f32 ? t.contiguous() : t.to(DType::f32).contiguous();
  const float* v = f.data<float>();
  const float* bad = std::find_if(v, v + f.numel(), [](float x) { return x < 0.f; });
  if (bad == v + f.numel()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(file, ": tensor '", name, "' holds ", *bad, " at element ", bad - v, " of ",
                                          f.numel(), "; it must be >= 0 (",
                                          kind == "exp_avg_sq" || kind == "state2" ? "a second moment" : "a magnitude",
                                          "): the file was damaged"));
}

// The optimizer-rank<r>.safetensors shards of a ZeRO-2 checkpoint, one tensor in memory at a time.
absl::Status check_rank_shards(const std::string& dir, const nlohmann::json& state, int64_t max_step) {
  const int64_t world = state.value("zero2_world", int64_t{1});
  for (int64_t r = 1; r < world; ++r) {
    const std::string path = (fs::path(dir) / absl::StrCat("optimizer-rank", r, ".safetensors")).string();
    auto f = SafetensorsFile::open(path);
    if (!f.ok()) return f.status();
    for (const TensorInfo& info : f->tensors())
      LOOM_RETURN_IF_ERROR(check_optimizer_tensor(info.name, read_tensor(*f, info), max_step, path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status write_train_checkpoint(const std::string& out_dir, int64_t step, const TrainCheckpoint& ckpt,
                                    const std::function<absl::Status(const std::string& dir)>& extra_files) {
  const fs::path final_dir = fs::path(out_dir) / absl::StrCat("checkpoint-", step);
  const fs::path tmp = fs::path(out_dir) / absl::StrCat(".checkpoint-", step, ".tmp.", getpid());
  // A NaN in the optimizer state or the masters would be resumed from forever after: refused before
  // anything is created (the adapter is checked by save_adapter inside extra_files).
  LOOM_RETURN_IF_ERROR(check_finite_to_save({ckpt.tensors.begin(), ckpt.tensors.end()},
                                            (final_dir / "optimizer.safetensors").string()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
  if (absl::Status s = write_checkpoint_files(tmp, ckpt, extra_files); !s.ok()) {
    fs::remove_all(tmp, ec);  // never leave a partial folder behind
    return s;
  }
  fs::remove_all(final_dir, ec);  // an older checkpoint of the same step (a resumed run) is replaced whole
  fs::rename(tmp, final_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp.string(), " to ", final_dir.string(), ": ", ec.message()));
  return fsync_path(out_dir);
}

namespace {
absl::Status write_checkpoint_files(const fs::path& tmp, const TrainCheckpoint& ckpt,
                                    const std::function<absl::Status(const std::string& dir)>& extra_files) {
  const std::vector<std::pair<std::string, Tensor>> tensors(ckpt.tensors.begin(), ckpt.tensors.end());
  if (absl::Status s = save_tensors((tmp / "optimizer.safetensors").string(), tensors); !s.ok()) return s;
  {
    std::ofstream f(tmp / "trainer_state.json");
    f << ckpt.state.dump(2) << "\n";
    f.flush();
    if (!f) return absl::DataLossError(absl::StrCat("cannot write ", (tmp / "trainer_state.json").string()));
  }
  if (absl::Status s = extra_files(tmp.string()); !s.ok()) return s;
  nlohmann::json sums = nlohmann::json::object();
  for (const auto& e : fs::directory_iterator(tmp)) {
    if (!e.is_regular_file()) continue;
    auto sum = file_checksum(e.path());
    if (!sum.ok()) return sum.status();
    sums[e.path().filename().string()] = *sum;
  }
  {
    std::ofstream f(tmp / kChecksums);
    f << sums.dump(2) << "\n";
    f.flush();
    if (!f) return absl::DataLossError(absl::StrCat("cannot write ", (tmp / kChecksums).string()));
  }
  for (const auto& e : fs::directory_iterator(tmp))
    if (absl::Status s = fsync_path(e.path()); !s.ok()) return s;
  return fsync_path(tmp);
}
}  // namespace

absl::StatusOr<std::string> resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return absl::NotFoundError(absl::StrCat("resume folder ", path, " does not exist"));
  if (fs::exists(fs::path(path) / "trainer_state.json")) return path;
  int64_t best = -1;
  std::string best_dir;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string n = e.path().filename().string();
    int64_t step = 0;
    // Only complete checkpoints: a state file that parses (one cut short by a crash is skipped).
    if (n.rfind("checkpoint-", 0) == 0 && absl::SimpleAtoi(n.substr(11), &step) && step > best &&
        fs::is_regular_file(e.path() / "trainer_state.json", ec) &&
        !nlohmann::json::parse(std::ifstream(e.path() / "trainer_state.json"), nullptr, false).is_discarded()) {
      best = step;
      best_dir = e.path().string();
    }
  }
  if (best < 0) return absl::NotFoundError(absl::StrCat(path, " holds no checkpoint-<step> folder with a trainer_state.json"));
  return best_dir;
}

absl::StatusOr<TrainCheckpoint> read_train_checkpoint(const std::string& dir, const ResumeOptions& options) {
  if (!options.no_verify) LOOM_RETURN_IF_ERROR(verify_checksums(dir));
  TrainCheckpoint c;
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  std::error_code ec;
  // nlohmann reads a stream through its buffer: a folder there throws ios_base::failure, not a status.
  if (fs::is_directory(state_path, ec)) return absl::InvalidArgumentError(absl::StrCat(state_path, ": is a folder, not a file"));
  std::ifstream f(state_path);
  c.state = nlohmann::json::parse(f, nullptr, false);
  if (c.state.is_discarded() || !c.state.is_object())
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": not a JSON object"));
  LOOM_RETURN_IF_ERROR(check_counters(c.state, state_path));
  const std::string optimizer_path = (fs::path(dir) / "optimizer.safetensors").string();
  auto tensors = load_tensors(optimizer_path);
  if (!tensors.ok()) return tensors.status();
  c.tensors = *std::move(tensors);
  const int64_t max_step = c.state.value("step", kMaxCheckpointCount);
  for (const auto& [name, t] : c.tensors) LOOM_RETURN_IF_ERROR(check_optimizer_tensor(name, t, max_step, optimizer_path));
  LOOM_RETURN_IF_ERROR(check_rank_shards(dir, c.state, max_step));
  return c;
}

absl::StatusOr<ResumePoint> find_resume_checkpoint(const std::string& path, const ResumeOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return absl::NotFoundError(absl::StrCat("resume folder ", path, " does not exist"));
  ResumePoint r;
  if (fs::exists(fs::path(path) / "trainer_state.json")) {  // one checkpoint, named: no fallback
    r.dir = path;
    LOOM_ASSIGN_OR_RETURN(r.checkpoint, read_train_checkpoint(path, options));
    return r;
  }
  for (const auto& [step, dir] : checkpoints_of(path)) {
    auto c = read_train_checkpoint(dir.string(), options);
    if (c.ok()) {
      r.dir = dir.string();
      r.checkpoint = *std::move(c);
      return r;
    }
    r.skipped.push_back(absl::StrCat(dir.string(), ": ", c.status().message()));
  }
  if (!r.skipped.empty())
    return absl::DataLossError(absl::StrCat("no intact checkpoint in ", path, ": ", r.skipped.front()));
  return absl::NotFoundError(absl::StrCat(path, " holds no checkpoint-<step> folder with a trainer_state.json"));
}

std::vector<std::string> clean_output_folder(const std::string& out_dir, bool fresh_run) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string n = e.path().filename().string();
    // .checkpoint-<step>.tmp.<pid> of a process that is gone (killed while saving).
    if (n.rfind(".checkpoint-", 0) == 0) {
      const size_t dot = n.rfind(".tmp.");
      int pid = 0;
      if (dot != std::string::npos && absl::SimpleAtoi(n.substr(dot + 5), &pid) && pid != getpid() &&
          (kill(pid, 0) != 0 && errno == ESRCH)) {
        fs::remove_all(e.path(), ec);
        removed.push_back(n);
      }
    }
  }
  if (fresh_run) {
    for (const auto& [step, dir] : checkpoints_of(out_dir)) {
      fs::remove_all(dir, ec);
      removed.push_back(dir.filename().string());
    }
  }
  return removed;
}

std::vector<std::string> prune_checkpoints(const std::string& out_dir, int64_t keep) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  const auto all = checkpoints_of(out_dir);
  std::error_code ec;
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) {
    fs::remove_all(all[i].second, ec);
    removed.push_back(all[i].second.filename().string());
  }
  return removed;
}

}  // namespace loom
