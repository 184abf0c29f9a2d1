// Per-device CUDA state: the main compute stream, the memory pool, one cuBLASLt handle with its
// workspace (shared with a cuBLAS handle for grouped GEMMs), and a reduction scratch buffer. Created lazily on first use, one per device.
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/common.h"

struct cublasLtContext;
struct cublasContext;

namespace loom {

struct CudaContext {
  int device = 0;
  Stream stream = nullptr;               // all of Loom's compute on this device is ordered here
  cublasLtContext* cublaslt = nullptr;   // == cublasLtHandle_t
  cublasContext* cublas = nullptr;       // == cublasHandle_t: on `stream`, with the GEMM workspace
  void* gemm_workspace = nullptr;
  size_t gemm_workspace_bytes = 0;
  float* reduce_workspace = nullptr;     // kReduceWorkspaceFloats floats
  int sm_count = 0;                      // streaming multiprocessors

  CudaContext() = default;
  // Waits for the stream, then frees the workspaces, the cuBLAS(Lt) handles and the stream (at exit:
  // the contexts live until static destruction, before the CUDA runtime's own teardown).
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // The context of device `index` (throws loom::Error in a CPU-only build or for a bad index). With
  // more than one GPU visible it also makes `index` the current device (every launch looks its
  // stream up here first), so ops on tensors of several GPUs each run on their own device.
  static CudaContext& get(int index);
};

// Makes `index` the current CUDA device for the scope (no-op in CPU-only builds).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Waits for all work queued on the device's compute stream.
void synchronize(int device);

// Lets each of `devices` read and write the others' memory directly (NVLink or PCIe peer to peer),
// so that copies between them (a --device-map's activations) need not go through the host; pairs
// without peer access are left to the runtime's staged copies. No-op for fewer than two devices.
void enable_peer_access(const std::vector<int>& devices);

}  // namespace loom
