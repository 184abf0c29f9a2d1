// ZeRO-2's sharding math in one pure function: where each parameter sits in the flat padded
// buffer, how long each rank's contiguous shard is, and which pieces of which parameters a rank
// owns. Parameter starts and shard boundaries fall on multiples of `alignment` (the update rule's:
// 8-bit AdamW's blocks of 256), so a piece of a parameter is updated exactly as the whole would be.
#pragma once
#include <cstdint>
#include <vector>

namespace loom::dist {

struct ShardPiece {
  int param = 0;       // index into the numels given to make_shard_layout
  int64_t begin = 0;   // elements [begin, end) of that parameter
  int64_t end = 0;
  int64_t flat = 0;    // where `begin` sits in the flat buffer
};

struct ShardLayout {
  int world = 1;
  int64_t alignment = 1;
  std::vector<int64_t> numels;
  std::vector<int64_t> offsets;  // each parameter's start in the flat buffer
  int64_t shard = 0;             // elements per rank (a multiple of alignment)
  int64_t total() const { return shard * world; }
  // The pieces rank r owns, in flat order; their flat offsets lie in [r * shard, (r + 1) * shard).
  std::vector<ShardPiece> pieces(int rank) const;
  // Elements of rank r's shard within flat range [lo, hi).
  int64_t overlap(int rank, int64_t lo, int64_t hi) const;
};

// Parameters laid out in the order given, each start rounded up to `alignment`; the total padded to
// world equal shards of a multiple of alignment elements (at least one alignment unit each).
ShardLayout make_shard_layout(const std::vector<int64_t>& numels, int64_t alignment, int world);

}  // namespace loom::dist
