// Lazily created per-device CUDA state (see cuda_context.h).
#include "engine/cuda_context.h"

#include <memory>
#include <mutex>
#include <vector>

#include "engine/device.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#if LOOM_WITH_CUDA
#include <cublas_v2.h>

#include "kernels/cuda_check.h"
#endif

namespace loom {

#if LOOM_WITH_CUDA
namespace {

std::unique_ptr<CudaContext> make_context(int index) {
  CudaDeviceGuard guard(index);
  auto ctx = std::make_unique<CudaContext>();
  ctx->device = index;
  cudaStream_t stream;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ctx->stream = stream;
  // Keep freed blocks in the pool instead of returning them to the driver at each sync.
  cudaMemPool_t pool;
  LOOM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
  uint64_t threshold = UINT64_MAX;
  LOOM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  cublasLtHandle_t handle;
  LOOM_CUBLAS_CHECK(cublasLtCreate(&handle));
  ctx->cublaslt = handle;
  LOOM_CUDA_CHECK(cudaMalloc(&ctx->gemm_workspace, kGemmWorkspaceBytes));
  ctx->gemm_workspace_bytes = kGemmWorkspaceBytes;
  LOOM_CUDA_CHECK(cudaMalloc(&ctx->reduce_workspace, cuda::kReduceWorkspaceFloats * sizeof(float)));
  // cuBLAS (grouped GEMMs) on the same stream, sharing cuBLASLt's workspace: the two never run at
  // once. Its stream first: cublasSetStream resets the workspace to cuBLAS's own pool.
  cublasHandle_t blas;
  LOOM_CUBLAS_CHECK(cublasCreate(&blas));
  ctx->cublas = blas;
  LOOM_CUBLAS_CHECK(cublasSetStream(blas, stream));
  LOOM_CUBLAS_CHECK(cublasSetWorkspace(blas, ctx->gemm_workspace, ctx->gemm_workspace_bytes));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount, index));
  return ctx;
}
}  // namespace

CudaContext::~CudaContext() {
  // Errors are ignored: this runs at exit, possibly after a sticky CUDA error ended the program.
  if (cudaSetDevice(device) != cudaSuccess) return;
  if (stream) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (cublas) cublasDestroy(cublas);  // before the workspace it was given
  if (gemm_workspace) cudaFree(gemm_workspace);
  if (reduce_workspace) cudaFree(reduce_workspace);
  if (cublaslt) cublasLtDestroy(cublaslt);
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

CudaContext& CudaContext::get(int index) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<CudaContext>> contexts(cuda_device_count());
  LOOM_CHECK(index >= 0 && index < static_cast<int>(contexts.size()), "CUDA device ", index,
             " does not exist (", contexts.size(), " visible)");
  std::lock_guard<std::mutex> lock(mu);
  if (!contexts[index]) contexts[index] = make_context(index);
  // With several GPUs (a --device-map run) the caller is about to launch on this device's stream:
  // make it current, as kernel launches and cuBLAS need. One GPU: it always is.
  if (contexts.size() > 1) {
    int current = -1;
    LOOM_CUDA_CHECK(cudaGetDevice(&current));
    if (current != index) LOOM_CUDA_CHECK(cudaSetDevice(index));
  }
  return *contexts[index];
}

CudaDeviceGuard::CudaDeviceGuard(int index) {
  LOOM_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) LOOM_CUDA_CHECK(cudaSetDevice(index));
}
CudaDeviceGuard::~CudaDeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

void synchronize(int device) {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(CudaContext::get(device).stream));
}

void enable_peer_access(const std::vector<int>& devices) {
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      LOOM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) continue;
      CudaDeviceGuard guard(a);
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clears it: enabling twice is fine
      } else {
        LOOM_CUDA_CHECK(e);
      }
    }
}

#else  // CPU-only build

CudaContext::~CudaContext() = default;
CudaContext& CudaContext::get(int index) {
  LOOM_CHECK(false, "Loom was built without CUDA (LOOM_CUDA=OFF); device cuda:", index, " is unavailable");
  __builtin_unreachable();
}
CudaDeviceGuard::CudaDeviceGuard(int) {}
CudaDeviceGuard::~CudaDeviceGuard() {}
void synchronize(int) {}
void enable_peer_access(const std::vector<int>&) {}

#endif

}  // namespace loom
