// `loom train --deepspeed ds_config.json`: the DeepSpeed fields Loom has, read as DeepSpeed reads
// them and turned into Loom's own flags (the command line and --config win over them):
//   zero_optimization.stage          0 -> --dist ddp, 1 and 2 -> --dist zero2 (1 with a note: Loom's
//                                    stage shards the gradients too), 3 refused (Loom does not shard
//                                    the parameters); --dist only when launched as several ranks
//   zero_optimization.offload_optimizer.device  cpu -> --offload-optimizer (nvme refused)
//   train_micro_batch_size_per_gpu   --batch-size;  gradient_accumulation_steps  --grad-accum;
//   train_batch_size                 checked against micro x accumulation x ranks (or fills the one
//                                    of those two left "auto", as DeepSpeed does)
//   gradient_clipping                --max-grad-norm
//   bf16.enabled / fp16.enabled      --dtype bf16 (fp16 runs as bf16: no loss scale needed), both
//                                    false -> --dtype f32
//   optimizer AdamW/Adam params      --lr, --weight-decay;  scheduler WarmupLR / WarmupDecayLR /
//                                    WarmupCosineLR          --schedule constant / linear / cosine, --warmup
// "auto" leaves Loom's own value. What Loom reads differently, or does not use, is listed in `notes`
// (said once at the start).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

struct DeepSpeedTranslation {
  std::vector<std::string> flags;  // "--name=value" (or "--name" for a switch), for parse_train_args
  std::vector<std::string> notes;
};
// `world_size`: the ranks of this launch (dist/launch_env.h).
absl::StatusOr<DeepSpeedTranslation> read_deepspeed_config(const std::string& path, int64_t world_size);

}  // namespace loom
