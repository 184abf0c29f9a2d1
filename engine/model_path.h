// The paths a user gives for a model or tokenizer (--model, --tokenizer): checked in one place
// before any loader opens them, so that an empty path, a Hugging Face model id, or a file of
// another kind (training data given as the model) gets a message saying what was expected.
#pragma once
#include <string>

#include "absl/status/status.h"

namespace loom {

// What a path holds, from the file system and the first bytes of a file.
enum class PathKind { kMissing, kFolder, kGguf, kSafetensors, kJson, kJsonl, kZip, kEmpty, kText, kBinary };
PathKind sniff_path(const std::string& path);
// "a GGUF file", "a JSONL file (one JSON value per line, like training data)", "a folder", ...
std::string describe(PathKind kind);

// OkStatus when `path` names something that exists. Else: an empty path is InvalidArgument "the
// <what> is empty (expected <expected>)"; a missing one is NotFound "the <what> <path>: No such file
// or directory (expected <expected>)", and when it looks like
// a Hugging Face model id (owner/name) the message says Loom reads local folders and GGUF files only
// and how to download one. `what` is e.g. "model path"; `expected` e.g. "a model folder or a .gguf file".
absl::Status check_input_path(const std::string& path, const std::string& what, const std::string& expected);

// The error for a path that exists but is of the wrong kind: InvalidArgument "<path>: expected
// <expected>, but this is <describe(kind)>" plus a hint for the usual mix-ups.
absl::Status wrong_kind(const std::string& path, PathKind kind, const std::string& expected);

}  // namespace loom
