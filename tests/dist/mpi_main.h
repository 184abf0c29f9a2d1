// main() of the `mpi` test programs: one ProcessGroup for the whole run (MPI is initialised once
// per process), a short deadline so that a rank failing alone cannot hang CTest, and only rank 0's
// GoogleTest output unless a rank fails (the exit status is the worst over the ranks).
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/process_group.h"

namespace loom::test {

inline dist::ProcessGroup* g_group = nullptr;
inline dist::ProcessGroup& group() { return *g_group; }

}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto g = loom::dist::ProcessGroup::init({/*timeout_s=*/60, /*cuda=*/false});
  if (!g.ok()) {
    std::fprintf(stderr, "%s\n", std::string(g.status().message()).c_str());
    return 2;
  }
  loom::test::g_group = g->get();
  if ((*g)->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS(), worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rc != 0) std::fprintf(stderr, "rank %d failed\n", (*g)->rank());
  g->reset();
  return worst;
}
