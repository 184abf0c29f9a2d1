// Launcher environment detection for mpirun, PMI/PMIx (srun --mpi=pmix), Slurm and torchrun.
#include <gtest/gtest.h>

#include <map>

#include "dist/launch_env.h"

namespace loom::test {
namespace {

absl::StatusOr<LaunchEnv> detect(const std::map<std::string, std::string>& vars) {
  return detect_launch_env([&](const char* k) -> const char* {
    auto it = vars.find(k);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnv, SingleProcessWhenNoLauncher) {
  auto e = detect({});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->world_size, 1);
  EXPECT_EQ(e->launcher, "single");
}

TEST(LaunchEnv, OpenMpi) {
  auto e = detect({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->launcher, "openmpi");
}

TEST(LaunchEnv, SrunWithPmixTakesSizeAndLocalIdFromSlurm) {
  auto e = detect({{"PMIX_RANK", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "3"}});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 3);
  EXPECT_EQ(e->launcher, "pmi");
}

TEST(LaunchEnv, TorchrunAndPlainSlurm) {
  auto t = detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->launcher, "torchrun");
  auto s = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->launcher, "slurm");
  EXPECT_EQ(s->world_size, 2);
}

TEST(LaunchEnv, MalformedOrInconsistentValuesNameTheVariable) {
  auto bad = detect({{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("OMPI_COMM_WORLD_RANK"), std::string::npos);
  auto over = detect({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  ASSERT_FALSE(over.ok());
  EXPECT_NE(std::string(over.status().message()).find("WORLD_SIZE"), std::string::npos);
  EXPECT_FALSE(detect({{"PMI_RANK", "0"}}).ok()) << "a rank without any size";
}

}  // namespace
}  // namespace loom::test
