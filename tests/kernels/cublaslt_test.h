// A GoogleTest fixture for CUDA tests that call cuBLASLt: a handle and the recommended workspace
// per test, skipped without a GPU.
#pragma once
#include <cublasLt.h>

#include <memory>

#include "kernels/gemm.h"
#include "tests/kernels/kernel_test_util.h"

namespace loom::test {

class CublasLtTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cublasLtCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    ws_ = std::make_unique<DeviceBuffer<unsigned char>>(kGemmWorkspaceBytes);
  }
  void TearDown() override {
    if (handle_) cublasLtDestroy(handle_);
  }

  cublasLtHandle_t handle_ = nullptr;
  std::unique_ptr<DeviceBuffer<unsigned char>> ws_;
};

}  // namespace loom::test
