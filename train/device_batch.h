// A micro-batch on the training device: its host rows checked (token ids within the vocabulary),
// staged in pinned memory and copied asynchronously (pageable copies would block the host on every
// micro-batch); the pinned blocks stay alive with the batch until the step has read its loss back,
// so no copy outlives them.
#pragma once
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tensor.h"
#include "models/causal_lm.h"
#include "train/data.h"

namespace loom {

struct DeviceBatch {
  Tensor input_ids, targets, positions, segment_ids;  // i32 [b, s], [b*s] (labels shifted), [b*s], [b, s]
  int64_t max_position = 0;  // the largest position, read on the host (LongRoPE picks its factors by it)
  Tensor host_targets;       // the shifted targets on the host (what per-sequence log-probs count)
  int64_t pairs = 0;         // a preference batch's pairs (Batch::pairs)
  std::vector<int64_t> pair_ids;  // Batch::pair_ids
  std::vector<int64_t> seq_start, seq_len;  // Batch::seq_start, seq_len
  bool packed = false;  // rows hold several sequences: attention needs the segment ids
  // The tokens that are not padding, as spans of the flattened rows (Batch::row_tokens); empty: all.
  std::vector<TokenSpan> unpadded;
  std::vector<Tensor> staging;
};

absl::StatusOr<std::vector<DeviceBatch>> upload(const std::vector<Batch>& batches, Device device, int64_t vocab);

}  // namespace loom
