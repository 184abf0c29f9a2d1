// Early-return helpers for absl::Status / absl::StatusOr code paths (user-input errors).
#pragma once
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LOOM_RETURN_IF_ERROR(expr)       \
  do {                                   \
    ::absl::Status loom_s_ = (expr);     \
    if (!loom_s_.ok()) return loom_s_;   \
  } while (0)

#define LOOM_STATUS_CAT2_(a, b) a##b
#define LOOM_STATUS_CAT_(a, b) LOOM_STATUS_CAT2_(a, b)
#define LOOM_ASSIGN_OR_RETURN_IMPL_(var, expr, tmp) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  var = *std::move(tmp)
// LOOM_ASSIGN_OR_RETURN(lhs, expr): lhs = *expr, or return expr's error.
#define LOOM_ASSIGN_OR_RETURN(var, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL_(var, expr, LOOM_STATUS_CAT_(loom_status_or_, __LINE__))
