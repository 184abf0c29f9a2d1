// The pinned host budget of --checkpointing offload: 80 % of MemAvailable, shared by the processes
// of the host that offload (set_offload_host_sharers: a distributed run's ranks on it), so that
// eight ranks on one host do not each claim 80 % of its memory.
#include <gtest/gtest.h>

#include "engine/memory.h"
#include "engine/offload.h"

namespace loom {
namespace {

TEST(OffloadBudget, TheRanksOfAHostShareIt) {
  const int64_t available = device_available_bytes(Device::cpu());
  if (available <= 0) GTEST_SKIP() << "no /proc/meminfo";
  set_offload_host_sharers(1);
  set_offload_host_budget(-1);
  const int64_t alone = offload_host_room();
  set_offload_host_sharers(4);
  const int64_t shared = offload_host_room();
  set_offload_host_sharers(1);
  const int64_t again = offload_host_room();
  // MemAvailable moves a little between the readings: a 5 % band around the expected share.
  EXPECT_NEAR(static_cast<double>(alone), 0.8 * static_cast<double>(available), 0.05 * static_cast<double>(available));
  EXPECT_NEAR(static_cast<double>(shared), static_cast<double>(alone) / 4, 0.05 * static_cast<double>(alone));
  EXPECT_NEAR(static_cast<double>(again), static_cast<double>(alone), 0.05 * static_cast<double>(alone));
  set_offload_host_sharers(0);  // nonsense counts as one process
  EXPECT_NEAR(static_cast<double>(offload_host_room()), static_cast<double>(alone), 0.05 * static_cast<double>(alone));
  set_offload_host_sharers(4);
  set_offload_host_budget(int64_t{1} << 20);  // an explicit budget is not divided
  EXPECT_EQ(offload_host_room(), int64_t{1} << 20);
  set_offload_host_sharers(1);  // and the default again
}

}  // namespace
}  // namespace loom
