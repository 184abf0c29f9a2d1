// Where `loom` commands write, one rule for every writer: an existing output is refused unless
// --overwrite is given; a file is written under a temporary name and renamed; a folder is built in
// a staging folder beside it and its files are moved in only once all of them are written, so a run
// that fails loses nothing that was there before.
#pragma once
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::cli {

inline constexpr char kAllowNonfiniteHelp[] = "load a model whose weights hold NaN or infinity (refused otherwise)";
inline constexpr char kOverwriteHelp[] = "replace an existing output (without it, an existing output file or folder is refused)";

// A file output (flag `flag` = `path`): refused when it is a folder, or exists and !overwrite.
absl::Status check_out_file(const std::string& flag, const std::string& path, bool overwrite);
// A folder output: refused when it is a file, or exists and !overwrite (the message says when it
// holds a model's weights).
absl::Status check_out_folder(const std::string& flag, const std::string& path, bool overwrite);

// A folder output built under "<out>.tmp.<pid>": write into dir(), then commit() moves each file into
// `out` (created when missing), replacing files of the same name and then removing the weights of an
// earlier model there (model*.safetensors, model.safetensors.index.json) that the new ones would be
// mixed with. The staging folder is removed when the object goes away, committed or not.
class StagedFolder {
 public:
  static absl::StatusOr<StagedFolder> create(const std::string& out);
  StagedFolder(StagedFolder&& o) noexcept : out_(std::move(o.out_)), dir_(std::move(o.dir_)) { o.dir_.clear(); }
  StagedFolder& operator=(StagedFolder&&) = delete;
  ~StagedFolder();

  const std::string& dir() const { return dir_; }
  absl::Status commit();

 private:
  StagedFolder(std::string out, std::string dir) : out_(std::move(out)), dir_(std::move(dir)) {}
  std::string out_, dir_;
};

}  // namespace loom::cli
