// ZeRO-2 sharding math (see shard_layout.h).
#include "dist/shard_layout.h"

#include <algorithm>

#include "kernels/error.h"

namespace loom::dist {
namespace {
int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
}  // namespace

ShardLayout make_shard_layout(const std::vector<int64_t>& numels, int64_t alignment, int world) {
  LOOM_CHECK(alignment >= 1 && world >= 1, "make_shard_layout: alignment ", alignment, ", world ", world);
  ShardLayout l;
  l.world = world;
  l.alignment = alignment;
  l.numels = numels;
  int64_t at = 0;
  for (int64_t n : numels) {
    LOOM_CHECK(n >= 0, "make_shard_layout: negative size ", n);
    at = round_up(at, alignment);
    l.offsets.push_back(at);
    at += n;
  }
  l.shard = std::max<int64_t>(alignment, round_up((at + world - 1) / world, alignment));
  return l;
}

int64_t ShardLayout::overlap(int rank, int64_t lo, int64_t hi) const {
  const int64_t a = std::max(lo, rank * shard), b = std::min(hi, (rank + 1) * shard);
  return std::max<int64_t>(0, b - a);
}

std::vector<ShardPiece> ShardLayout::pieces(int rank) const {
  std::vector<ShardPiece> out;
  const int64_t lo = rank * shard, hi = lo + shard;
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t a = std::max(lo, offsets[i]), b = std::min(hi, offsets[i] + numels[i]);
    if (a < b) out.push_back({static_cast<int>(i), a - offsets[i], b - offsets[i], a});
  }
  return out;
}

}  // namespace loom::dist
