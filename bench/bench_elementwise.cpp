// Benchmarks of kernels/elementwise.h on the GPU: axpby, mul, scale, add_bias, sum_rows, fill,
// strided copies (transpose, cast, byte copy) and the sum / sum-of-squares reductions.
#include <string>

#include "bench/bench_util.h"
#include "kernels/elementwise.h"

namespace loom::bench {
namespace {

template <class T>
const char* dname() {
  return sizeof(T) == 4 ? "f32" : "bf16";
}

constexpr int64_t kN = int64_t(128) << 20;  // 128Mi elements: 256 MiB (bf16) to 512 MiB (f32) per array
constexpr int64_t kRows = 16384, kCols = 4096;  // tokens x hidden size of a Llama-7B batch
constexpr int64_t kSquare = 8192;

std::string shape2(int64_t r, int64_t c) { return std::to_string(r) + "x" + std::to_string(c); }

template <class T>
void register_binary() {
  const double es = sizeof(T);
  const std::string tail = std::string("/") + dname<T>() + "/" + size_name(kN);
  add("axpby" + tail, [es](benchmark::State& st) {
    auto a = random_array<T>(kN), b = random_array<T>(kN);
    DeviceArray<T> out(kN);
    run_timed(st, {3 * es * kN}, [&] { cuda::axpby<T>(a.get(), b.get(), out.get(), kN, 1.f, -0.5f, ctx().stream); });
  });
  add("mul" + tail, [es](benchmark::State& st) {
    auto a = random_array<T>(kN), b = random_array<T>(kN);
    DeviceArray<T> out(kN);
    run_timed(st, {3 * es * kN}, [&] { cuda::mul<T>(a.get(), b.get(), out.get(), kN, ctx().stream); });
  });
  add("scale" + tail, [es](benchmark::State& st) {
    auto a = random_array<T>(kN);
    DeviceArray<T> out(kN);
    run_timed(st, {2 * es * kN}, [&] { cuda::scale<T>(a.get(), out.get(), kN, 0.75f, ctx().stream); });
  });
  add("sum_squares" + tail, [es](benchmark::State& st) {
    auto a = random_array<T>(kN);
    DeviceArray<float> out(1);
    run_timed(st, {es * kN},
              [&] { cuda::sum_squares<T>(a.get(), kN, out.get(), ctx().reduce_ws, ctx().stream); });
  });
}

// dst [c, r] (contiguous) = src [r, c] transposed: the view's shape {c, r}, strides {1, c}.
StridedLayout transposed(int64_t r, int64_t c) {
  StridedLayout l;
  l.ndim = 2;
  l.shape[0] = c, l.shape[1] = r;
  l.strides[0] = 1, l.strides[1] = c;
  return l;
}

StridedLayout contiguous(int64_t n) {
  StridedLayout l;
  l.ndim = 1;
  l.shape[0] = n;
  l.strides[0] = 1;
  return l;
}

template <class T>
void register_transpose() {
  add(std::string("transpose/") + dname<T>() + "/" + shape2(kSquare, kSquare), [](benchmark::State& st) {
    const int64_t n = kSquare * kSquare;
    auto src = random_array<T>(n);
    DeviceArray<T> dst(n);
    const StridedLayout l = transposed(kSquare, kSquare);
    run_timed(st, {2.0 * sizeof(T) * n}, [&] { cuda::copy_strided<T, T>(src.get(), l, dst.get(), ctx().stream); });
  });
}

template <class S, class D>
void register_cast() {
  add(std::string("cast/") + dname<S>() + "_to_" + dname<D>() + "/" + size_name(kN), [](benchmark::State& st) {
    auto src = random_array<S>(kN);
    DeviceArray<D> dst(kN);
    const StridedLayout l = contiguous(kN);
    run_timed(st, {double(sizeof(S) + sizeof(D)) * kN},
              [&] { cuda::copy_strided<S, D>(src.get(), l, dst.get(), ctx().stream); });
  });
}

}  // namespace

void register_elementwise() {
  register_binary<float>();
  register_binary<bf16>();

  add("add_bias/bf16/" + shape2(kRows, kCols), [](benchmark::State& st) {
    auto a = random_array<bf16>(kRows * kCols), bias = random_array<bf16>(kCols);
    DeviceArray<bf16> out(kRows * kCols);
    run_timed(st, {2.0 * (2 * kRows * kCols + kCols)},
              [&] { cuda::add_bias<bf16>(a.get(), bias.get(), out.get(), kRows, kCols, ctx().stream); });
  });
  // The bias gradient: out[c] += sum over rows, bf16 in, f32 out.
  add("sum_rows/bf16_to_f32/" + shape2(kRows, kCols), [](benchmark::State& st) {
    auto a = random_array<bf16>(kRows * kCols);
    auto out = random_array<float>(kCols);
    DeviceArray<uint8_t> ws(cuda::sum_rows_workspace_bytes(kRows, kCols));
    run_timed(st, {2.0 * kRows * kCols + 8.0 * kCols}, [&] {
      cuda::sum_rows<bf16, float>(a.get(), out.get(), kRows, kCols, true, ws.get(), ctx().stream);
    });
  });
  add("fill/bf16/" + size_name(kN), [](benchmark::State& st) {
    DeviceArray<bf16> out(kN);
    run_timed(st, {2.0 * kN}, [&] { cuda::fill<bf16>(out.get(), kN, 0.5f, ctx().stream); });
  });
  add("sum/bf16/" + size_name(kN), [](benchmark::State& st) {
    auto a = random_array<bf16>(kN);
    DeviceArray<float> out(1);
    run_timed(st, {2.0 * kN}, [&] { cuda::sum<bf16>(a.get(), kN, out.get(), ctx().reduce_ws, ctx().stream); });
  });

  register_transpose<float>();
  register_transpose<bf16>();
  // Integer tensors go through the byte copy: a 4-byte transpose (the bits are random floats).
  add("transpose_bytes/i32/" + shape2(kSquare, kSquare), [](benchmark::State& st) {
    const int64_t n = kSquare * kSquare;
    auto src = random_array<float>(n);
    DeviceArray<float> dst(n);
    const StridedLayout l = transposed(kSquare, kSquare);
    run_timed(st, {8.0 * n}, [&] { cuda::copy_strided_bytes(src.get(), l, dst.get(), 4, ctx().stream); });
  });
  register_cast<float, bf16>();
  register_cast<bf16, float>();
}

}  // namespace loom::bench
