// Helpers for kernel tests: seeded random inputs, relative-error comparison, and (with CUDA) a
// device buffer that copies host vectors in and out. Tolerances are stated in each test.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/common.h"

namespace loom::test {

// Uniform in [lo, hi), rounded to T; fresh values per seed.
template <class T>
std::vector<T> random_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = from_acc<T>(static_cast<Acc<T>>(dist(gen)));
  return v;
}

template <class T>
std::vector<float> to_float_vec(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(to_acc(v[i]));
  return out;
}

// ||a - b|| / max(||b||, tiny); NaN anywhere yields +inf so it never passes.
template <class A, class B>
double rel_error(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double x = double(to_acc(a[i])), y = double(to_acc(b[i]));
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Tolerances on the relative L2 error, per output dtype: f32 results differ from the CPU only in
// summation order (~1e-6); bf16 outputs carry one rounding of 2^-9 relative (~4e-3) plus order.
template <class T>
constexpr double tol() { return 1e-5; }
template <>
constexpr double tol<bf16>() { return 8e-3; }

// Against a naive f64 formula: tol<T>() for f32/bf16; f64 differs only by summation order (~1e-15).
template <class T>
double ref_tol() { return tol<T>(); }
template <>
inline double ref_tol<double>() { return 1e-12; }

template <class T>
std::vector<double> to_f64(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = double(to_acc(v[i]));
  return out;
}

// Every element within atol + rtol * |ref| (NaN never passes); reports the count and the worst one.
template <class A, class B>
void expect_close(const std::vector<A>& got, const std::vector<B>& ref, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = double(to_acc(got[i])), r = double(to_acc(ref[i]));
    const double err = std::abs(g - r), lim = atol + rtol * std::abs(r);
    if (!(err <= lim)) {
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err - lim;
      if (worst < 0 || excess > worst_excess) {
        worst_excess = excess;
        worst = int64_t(i);
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": worst at " << worst << " got "
                    << (worst >= 0 ? double(to_acc(got[worst])) : 0.0) << " want "
                    << (worst >= 0 ? double(to_acc(ref[worst])) : 0.0);
}

}  // namespace loom::test

#if LOOM_WITH_CUDA
#include <cuda_runtime.h>

namespace loom::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define LOOM_REQUIRE_GPU() \
  if (!::loom::test::have_gpu()) GTEST_SKIP() << "no CUDA device"

// Owns device memory holding n elements of T; poisoned with 0xFF bytes (NaN for floats) on
// creation so unwritten outputs fail comparisons.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    cudaMemset(p_, 0xFF, std::max<size_t>(n, 1) * sizeof(T));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() { return p_; }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

}  // namespace loom::test
#endif
