// Reading a JSON file that came from elsewhere (config.json, tokenizer_config.json, ...) as a
// Status: a missing file, a directory in its place, an unreadable or malformed file each get a
// message naming the path and the reason, never an exception from the stream or the parser.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace loom {

// The parsed document; NotFound when the path cannot be opened (with the operating system's
// reason), InvalidArgument when it is not JSON (with the parser's byte offset).
absl::StatusOr<nlohmann::json> read_json_file(const std::string& path);

}  // namespace loom
