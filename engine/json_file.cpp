// See json_file.h.
#include "engine/json_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/io_error.h"

namespace loom {

absl::StatusOr<nlohmann::json> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in || is_directory_path(path))
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", open_error_reason(path)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON (byte ", e.byte, ")"));
  }
}

}  // namespace loom
