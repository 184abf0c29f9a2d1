// The precision policy (see precision.h).
#include "engine/precision.h"

#include "absl/strings/str_cat.h"

namespace loom {

std::string Precision::str() const {
  auto n = [](DType d) { return std::string(name(d)); };
  return absl::StrCat("storage ", n(storage), ", compute ", n(compute), ", accumulate ", n(accumulate), ", master ",
                      n(master), ", adapter ", n(adapter));
}

absl::StatusOr<DType> parse_model_dtype(const std::string& text) {
  if (text == "bf16") return DType::bf16;
  if (text == "f32") return DType::f32;
  return absl::InvalidArgumentError(absl::StrCat("--dtype must be bf16 or f32, got '", text, "'"));
}

}  // namespace loom
