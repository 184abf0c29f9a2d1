// Training checkpoints on disk (see train_checkpoint.h).
#include "train/train_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/tensor_io.h"

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

}  // namespace

absl::Status write_train_checkpoint(const std::string& out_dir, int64_t step, const TrainCheckpoint& ckpt,
                                    const std::function<absl::Status(const std::string& dir)>& extra_files) {
  const fs::path final_dir = fs::path(out_dir) / absl::StrCat("checkpoint-", step);
  const fs::path tmp = fs::path(out_dir) / absl::StrCat(".checkpoint-", step, ".tmp.", getpid());
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

absl::StatusOr<TrainCheckpoint> read_train_checkpoint(const std::string& dir) {
  TrainCheckpoint c;
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  std::error_code ec;
  // nlohmann reads a stream through its buffer: a folder there throws ios_base::failure, not a status.
  if (fs::is_directory(state_path, ec)) return absl::InvalidArgumentError(absl::StrCat(state_path, ": is a folder, not a file"));
  std::ifstream f(state_path);
  c.state = nlohmann::json::parse(f, nullptr, false);
  if (c.state.is_discarded() || !c.state.is_object())
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": not a JSON object"));
  auto tensors = load_tensors((fs::path(dir) / "optimizer.safetensors").string());
  if (!tensors.ok()) return tensors.status();
  c.tensors = *std::move(tensors);
  return c;
}

}  // namespace loom
