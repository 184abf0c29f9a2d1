// See device_batch.h.
#include "train/device_batch.h"

#include <algorithm>

#include "engine/status_macros.h"
#include "models/causal_lm.h"

namespace loom {
namespace {

Tensor stage(const Tensor& host, Device device, std::vector<Tensor>& staging) {
  if (!host.defined() || device.is_cpu()) return host;
  Tensor pinned = Tensor::empty_pinned(host.shape(), host.dtype());
  pinned.copy_(host);
  staging.push_back(pinned);
  return pinned.to(device);
}

}  // namespace

// Token ids are checked on the host, where they are, before the copy (see check_token_ids).
absl::StatusOr<std::vector<DeviceBatch>> upload(const std::vector<Batch>& batches, Device device, int64_t vocab) {
  std::vector<DeviceBatch> out(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    DeviceBatch& d = out[i];
    const Tensor targets = shift_labels(b.labels);
    LOOM_RETURN_IF_ERROR(check_token_ids(b.input_ids, vocab, false, "input_ids"));
    LOOM_RETURN_IF_ERROR(check_token_ids(targets, vocab, true, "targets"));
    d.input_ids = stage(b.input_ids, device, d.staging);
    d.targets = stage(targets, device, d.staging);
    d.host_targets = targets;
    d.pairs = b.pairs;
    d.pair_ids = b.pair_ids;
    d.seq_start = b.seq_start, d.seq_len = b.seq_len;
    const int64_t seq = b.input_ids.size(1);
    bool padded = false;
    for (int64_t n : b.row_tokens) padded |= n < seq;
    if (padded)
      for (size_t r = 0; r < b.row_tokens.size(); ++r)
        if (b.row_tokens[r] > 0) d.unpadded.push_back({static_cast<int64_t>(r) * seq, b.row_tokens[r]});
    d.positions = stage(b.positions, device, d.staging);
    for (int32_t p : b.positions.to_ints()) d.max_position = std::max<int64_t>(d.max_position, p);
    // Rows that are each one piece of one document need no segment mask (see one_segment_per_row).
    d.packed = !one_segment_per_row(b);
    if (d.packed) d.segment_ids = stage(b.segment_ids, device, d.staging);
  }
  return out;
}

}  // namespace loom
