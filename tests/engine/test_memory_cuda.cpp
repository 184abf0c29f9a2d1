// The long-lived pool (engine/memory.h): allocations in a LongLivedPoolScope come from it, others from
// the default pool, its freed blocks come back for the same sizes without asking the driver again, and
// the reserved high-water mark counts it.
#include <gtest/gtest.h>

#include "engine/memory.h"
#include "engine/tensor.h"

namespace loom {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(LongLivedPool, ScopedAllocationsComeFromIt) {
  const Device gpu = Device::cuda(0);
  const PoolBytes before = long_lived_pool_bytes(gpu);
  {
    Tensor outside = Tensor::empty({16 * kMiB}, DType::f32, gpu);  // 64 MiB from the default pool
    EXPECT_EQ(long_lived_pool_bytes(gpu).used, before.used);
    Tensor inside;
    {
      const LongLivedPoolScope scope;
      inside = Tensor::empty({8 * kMiB}, DType::f32, gpu);  // 32 MiB
    }
    EXPECT_EQ(long_lived_pool_bytes(gpu).used, before.used + 32 * kMiB);
    Tensor after_scope = Tensor::empty({8 * kMiB}, DType::f32, gpu);  // the scope ended: default pool again
    EXPECT_EQ(long_lived_pool_bytes(gpu).used, before.used + 32 * kMiB);
  }
  EXPECT_EQ(long_lived_pool_bytes(gpu).used, before.used);
  const int64_t reserved = long_lived_pool_bytes(gpu).reserved;
  EXPECT_GE(reserved, 32 * kMiB);
  {
    const LongLivedPoolScope scope;  // the same size again: the kept block, nothing new from the driver
    const Tensor again = Tensor::empty({8 * kMiB}, DType::f32, gpu);
    EXPECT_EQ(long_lived_pool_bytes(gpu).reserved, reserved);
  }
}

// The reserved high-water mark counts the long-lived pool: growing it alone raises the mark.
TEST(LongLivedPool, CountsInTheReservedPeak) {
  const Device gpu = Device::cuda(0);
  reset_peak_memory(gpu);
  const int64_t before = pool_reserved_peak_bytes(gpu);
  {
    const LongLivedPoolScope scope;
    const Tensor big = Tensor::empty({64 * kMiB}, DType::f32, gpu);  // 256 MiB, more than it keeps so far
    EXPECT_GE(pool_reserved_peak_bytes(gpu) - before, 256 * kMiB);
  }
}

// Pinned blocks (allocate_pinned): a freed block comes back for a request it holds up to 4 times over
// (a narrower batch's activation copies take the full-width steps' blocks), not for a smaller one.
TEST(PinnedCache, AFreedBlockServesRequestsUpToAQuarterOfIt) {
  release_cached_pinned_memory();
  void* block = nullptr;
  {
    const std::shared_ptr<Storage> s = allocate_pinned(4 * kMiB);
    block = s->data();
  }
  {
    const std::shared_ptr<Storage> s = allocate_pinned(1 * kMiB + 1);  // 4 MiB <= 4 x its size
    EXPECT_EQ(s->data(), block);
    EXPECT_EQ(s->nbytes(), static_cast<size_t>(kMiB + 1));
  }
  {
    const std::shared_ptr<Storage> s = allocate_pinned(kMiB / 2);  // 4 MiB > 4 x 512 KiB: a block of its own
    EXPECT_NE(s->data(), block);
  }
  release_cached_pinned_memory();
}

}  // namespace
}  // namespace loom
