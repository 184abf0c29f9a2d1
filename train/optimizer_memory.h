// The start-of-run line of `loom train --offload-optimizer`: the GPU memory of optimizer state and
// f32 masters that CPU offload moves to pinned host memory.
#pragma once
#include <cstdint>
#include <string>

#include "optim/optimizer.h"

namespace loom {

// GPU bytes an unsharded offloaded optimizer keeps on the host instead: its state and the f32
// masters of non-f32 parameters (a sharded one's are dist::Zero2::shard_bytes()).
int64_t offloaded_gpu_bytes(const optim::Optimizer& opt);
// "loom train: --offload-optimizer: ... MiB of GPU memory ..." for `bytes` moved per rank.
std::string offload_summary(int64_t bytes, int64_t state_bytes, int64_t master_bytes, int64_t host_only_bytes);
// Prints the line for an unsharded optimizer (one process or DDP).
void print_offload_summary(const optim::Optimizer& opt);

}  // namespace loom
