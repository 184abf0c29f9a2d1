// Output paths of the `loom` commands (see outputs.h).
#include "tools/outputs.h"

#include <unistd.h>

#include <filesystem>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loom::cli {
namespace fs = std::filesystem;

namespace {
bool is_weights_file(const std::string& name) {
  return name == "model.safetensors.index.json" || (name.starts_with("model") && name.ends_with(".safetensors"));
}
}  // namespace

absl::Status check_out_file(const std::string& flag, const std::string& path, bool overwrite) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is a folder: expected a file name"));
  if (fs::exists(path, ec) && !overwrite)
    return absl::AlreadyExistsError(
        absl::StrCat(flag, " ", path, " already exists: choose another name, or pass --overwrite to replace it"));
  return absl::OkStatus();
}

absl::Status check_out_folder(const std::string& flag, const std::string& path, bool overwrite) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::OkStatus();
  if (!fs::is_directory(path, ec))
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is a file: expected a folder"));
  if (overwrite) return absl::OkStatus();
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"})
    if (fs::exists(fs::path(path) / name, ec))
      return absl::AlreadyExistsError(absl::StrCat(flag, " ", path, " already holds a model (",
                                                   (fs::path(path) / name).string(),
                                                   "): choose another folder, or pass --overwrite to replace it"));
  return absl::AlreadyExistsError(absl::StrCat(
      flag, " ", path, " already exists: choose another folder, or pass --overwrite to write into it"));
}

absl::StatusOr<StagedFolder> StagedFolder::create(const std::string& out) {
  const std::string dir = absl::StrCat(fs::path(out).lexically_normal().string(), ".tmp.", getpid());
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create the folder: ", ec.message()));
  return StagedFolder(out, dir);
}

StagedFolder::~StagedFolder() {
  if (dir_.empty()) return;
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

absl::Status StagedFolder::commit() {
  std::error_code ec;
  fs::create_directories(out_, ec);
  if (ec) return absl::InternalError(absl::StrCat(out_, ": cannot create the folder: ", ec.message()));
  std::vector<fs::path> files;
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    files.push_back(e.path());
    names.insert(e.path().filename().string());
  }
  if (ec) return absl::InternalError(absl::StrCat(dir_, ": cannot list the folder: ", ec.message()));
  for (const fs::path& f : files) {
    fs::rename(f, fs::path(out_) / f.filename(), ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot move ", f.string(), " into ", out_, ": ", ec.message()));
  }
  // An earlier model's other weights files (a shard, a stale index) would be loaded with or instead
  // of the new ones.
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(out_, ec)) {
    const std::string name = e.path().filename().string();
    if (is_weights_file(name) && !names.count(name)) stale.push_back(e.path());
  }
  for (const fs::path& f : stale) {
    fs::remove(f, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot remove the earlier model's ", f.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace loom::cli
