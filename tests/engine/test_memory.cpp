// pinned_block_size: the sizes the pinned-block cache hands out (engine/memory.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "engine/memory.h"

namespace loom {
namespace {

TEST(PinnedBlockSize, SmallSizesAreKept) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{4096}}) EXPECT_EQ(pinned_block_size(n), n);
  EXPECT_EQ(pinned_block_size(0), 1u);
}

TEST(PinnedBlockSize, LargerSizesRoundUpBySixteenthsOfTheirPowerOfTwo) {
  EXPECT_EQ(pinned_block_size(4097), 4352u);                 // 4096 + 256
  EXPECT_EQ(pinned_block_size(1u << 20), 1u << 20);          // a power of two is a class
  EXPECT_EQ(pinned_block_size((1u << 20) + 1), (1u << 20) + (1u << 16));
  for (size_t n = 4097; n < (size_t{1} << 34); n = n * 3 / 2 + 17) {
    const size_t b = pinned_block_size(n);
    EXPECT_GE(b, n);
    EXPECT_LE(static_cast<double>(b), static_cast<double>(n) * 1.0625) << n;
    EXPECT_EQ(pinned_block_size(b), b) << n;  // a class maps to itself
  }
}

// A preference batch's offloaded activations vary with its longest pair: 8 rows x 1,600..1,800
// tokens x 2,048 x 2 bytes (52.4 to 59.0 MB, above 2^25: classes 2 MiB apart) fall in 5 classes,
// not 201; a request then takes a free block of up to a quarter more, so they all share blocks.
TEST(PinnedBlockSize, NearbySizesShareFewClasses) {
  std::set<size_t> classes;
  for (size_t len = 1600; len <= 1800; ++len) classes.insert(pinned_block_size(8 * len * 2048 * 2));
  EXPECT_EQ(classes.size(), 5u);
  EXPECT_LE(static_cast<double>(*classes.rbegin()), 1.25 * static_cast<double>(8 * 1600 * 2048 * 2));
}

}  // namespace
}  // namespace loom
