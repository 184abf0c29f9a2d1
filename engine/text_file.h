// Writing a small text file (a config, an adapter's JSON, a metrics summary) so that no reader ever
// sees half of it: a temporary name beside the path, then a rename over it.
#pragma once
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace loom {

// text into path through `path.tmp.<pid>` and a rename; an error names the file and the reason.
absl::Status write_text_atomic(const std::string& path, std::string_view text);

// dir and its missing parents; an error names the folder and the reason.
absl::Status create_folder(const std::string& dir);

}  // namespace loom
