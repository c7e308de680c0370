// Device-side checks for the GPU tests (device_compare.hpp). Thrust is the tool here: a max with
// its index plus counts is one transform_reduce over the element indices, and bitwise equality is
// mismatch over words; both without a hand-written kernel, grid choice or partial-result buffer.
// The dtype is a runtime switch inside the functor (uniform across the grid), so each algorithm is
// instantiated once rather than once per pair of dtypes.
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/mismatch.h>
#include <thrust/transform_reduce.h>

#include <cstdint>

#include "decodegraph/numeric.hpp"
#include "device_compare.hpp"

namespace dgtest {
namespace {

using decodegraph::DType;

__device__ float load(DType dtype, const void* p, std::size_t i) {
  switch (dtype) {
    case DType::kFloat16: return decodegraph::fp16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16: return decodegraph::bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kFloat32: return static_cast<const float*>(p)[i];
  }
  return 0.0f;
}

constexpr std::size_t kNone = ~std::size_t{0};

// The reduction state: one element's (transform) or a range's (combine) summary.
struct Summary {
  double max_abs;      // -1: no finite pair yet
  std::size_t max_index;
  float a, b;          // at max_index
  std::size_t non_finite, first_non_finite;
  std::size_t over_tol, first_over_tol;
};

struct ElementSummary {
  DType a_dtype, b_dtype;
  const void* a;
  const void* b;
  double atol, rtol;
  __device__ Summary operator()(std::size_t i) const {
    const float x = load(a_dtype, a, i), y = load(b_dtype, b, i);
    if (!isfinite(x) || !isfinite(y)) return Summary{-1.0, kNone, 0.f, 0.f, 1, i, 0, kNone};
    const double err = fabs(static_cast<double>(x) - static_cast<double>(y));
    const bool over = err > atol + rtol * fabs(static_cast<double>(y));
    return Summary{err, i, x, y, 0, kNone, over ? 1u : 0u, over ? i : kNone};
  }
};

struct CombineSummaries {
  __device__ Summary operator()(const Summary& l, const Summary& r) const {
    const bool take_r = r.max_abs > l.max_abs || (r.max_abs == l.max_abs && r.max_index < l.max_index);
    Summary s = take_r ? r : l;
    s.non_finite = l.non_finite + r.non_finite;
    s.first_non_finite = l.first_non_finite < r.first_non_finite ? l.first_non_finite : r.first_non_finite;
    s.over_tol = l.over_tol + r.over_tol;
    s.first_over_tol = l.first_over_tol < r.first_over_tol ? l.first_over_tol : r.first_over_tol;
    return s;
  }
};

template <typename Word>
std::size_t first_mismatch(const void* a, const void* b, std::size_t bytes, cudaStream_t stream) {
  const Word* x = static_cast<const Word*>(a);
  const Word* y = static_cast<const Word*>(b);
  const std::size_t n = bytes / sizeof(Word);
  const auto at = thrust::mismatch(thrust::cuda::par.on(stream), x, x + n, y);
  return static_cast<std::size_t>(at.first - x) * sizeof(Word);
}

}  // namespace

DeviceDiff device_diff(DType a_dtype, const void* a, DType b_dtype, const void* b, std::size_t n, double atol,
                       double rtol, cudaStream_t stream) {
  DeviceDiff d;
  d.n = n;
  if (n == 0) return d;
  const thrust::counting_iterator<std::size_t> first(0);
  const Summary s = thrust::transform_reduce(thrust::cuda::par.on(stream), first, first + n,
                                             ElementSummary{a_dtype, b_dtype, a, b, atol, rtol},
                                             Summary{-1.0, kNone, 0.f, 0.f, 0, kNone, 0, kNone}, CombineSummaries{});
  d.max_abs = s.max_abs < 0 ? 0 : s.max_abs;
  d.max_index = s.max_index == kNone ? 0 : s.max_index;
  d.a_at_max = s.a;
  d.b_at_max = s.b;
  d.non_finite = s.non_finite;
  d.first_non_finite = s.non_finite ? s.first_non_finite : 0;
  d.over_tol = s.over_tol;
  d.first_over_tol = s.over_tol ? s.first_over_tol : 0;
  return d;
}

std::size_t device_first_mismatch(const void* a, const void* b, std::size_t bytes, cudaStream_t stream) {
  // Whole 32-bit words when both buffers allow it (every output here does); bytes otherwise.
  const bool words = bytes % 4 == 0 && reinterpret_cast<std::uintptr_t>(a) % 4 == 0 &&
                     reinterpret_cast<std::uintptr_t>(b) % 4 == 0;
  const std::size_t at = words ? first_mismatch<uint32_t>(a, b, bytes, stream)
                               : first_mismatch<unsigned char>(a, b, bytes, stream);
  if (at == bytes || !words) return at;
  // Narrow the differing word to its first differing byte (4 bytes each side).
  unsigned char x[4], y[4];
  if (cudaMemcpy(x, static_cast<const unsigned char*>(a) + at, 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(y, static_cast<const unsigned char*>(b) + at, 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    return at;
  std::size_t k = 0;
  while (k < 3 && x[k] == y[k]) ++k;
  return at + k;
}

}  // namespace dgtest
