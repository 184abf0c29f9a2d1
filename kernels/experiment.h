// Kernel choices still being measured end to end. Each has a build constant (what the figures so far
// support); experiment_switch returns it unless the process's environment sets the named variable to
// 0 or 1, so that one binary times both answers in one device call (bench/e2e/run.sh and moe.sh name
// the variables they were given in their rows). A choice leaves this mechanism once measured: its
// constant is set from the figures and the variable is no longer read. Any other value is an error
// naming the variable.
//   LOOM_GEMM_TIMED   engine/ops_linalg.cpp (cuda::GemmAlgoChoice::kTimed for every product)
#pragma once

namespace loom {
bool experiment_switch(const char* name, bool built);
}  // namespace loom
