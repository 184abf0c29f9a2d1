// ZeRO-2's sharding math: every element of every parameter is owned by exactly one rank, shards are
// equal and aligned, parameter starts are aligned, and pieces map back to the right elements.
#include <gtest/gtest.h>

#include "dist/shard_layout.h"

namespace loom::test {
namespace {

TEST(ShardLayout, EveryElementHasExactlyOneOwnerAndPiecesAreAligned) {
  const std::vector<int64_t> numels = {1000, 5, 4096, 257, 1, 70000};
  for (int64_t align : {1, 256}) {
    for (int world : {1, 2, 3, 4, 7}) {
      const dist::ShardLayout l = dist::make_shard_layout(numels, align, world);
      ASSERT_EQ(l.shard % align, 0);
      int64_t used = 0;
      for (size_t i = 0; i < numels.size(); ++i) {
        EXPECT_EQ(l.offsets[i] % align, 0);
        if (i > 0) {
          EXPECT_GE(l.offsets[i], l.offsets[i - 1] + numels[i - 1]);
        }
        used = l.offsets[i] + numels[i];
      }
      EXPECT_GE(l.total(), used);
      EXPECT_LT(l.total() - used, world * align + l.shard) << "padding is less than one shard plus alignment";
      std::vector<std::vector<int>> owners(numels.size());
      for (size_t i = 0; i < numels.size(); ++i) owners[i].assign(numels[i], 0);
      for (int r = 0; r < world; ++r) {
        for (const dist::ShardPiece& p : l.pieces(r)) {
          EXPECT_GE(p.flat, r * l.shard);
          EXPECT_LE(p.flat + (p.end - p.begin), (r + 1) * l.shard);
          EXPECT_EQ(p.flat, l.offsets[p.param] + p.begin);
          EXPECT_EQ(p.begin % align, 0) << "a piece starts on a block boundary of its parameter";
          for (int64_t e = p.begin; e < p.end; ++e) ++owners[p.param][e];
        }
      }
      for (size_t i = 0; i < numels.size(); ++i)
        for (int64_t e = 0; e < numels[i]; ++e) ASSERT_EQ(owners[i][e], 1) << "param " << i << " elem " << e;
    }
  }
}

TEST(ShardLayout, OverlapCountsSumToTheRange) {
  const dist::ShardLayout l = dist::make_shard_layout({300, 600, 50}, 1, 3);
  EXPECT_EQ(l.shard, 317);  // ceil(950 / 3)
  for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, 951}, {100, 700}, {317, 634}, {5, 5}}) {
    int64_t sum = 0;
    for (int r = 0; r < 3; ++r) sum += l.overlap(r, lo, hi);
    EXPECT_EQ(sum, hi - lo);
  }
  EXPECT_EQ(l.overlap(1, 0, 317), 0);
}

}  // namespace
}  // namespace loom::test
