// Seeded random fill of device buffers, so caches of tens of GB fill at memory speed instead of
// being generated on the host and copied. Values are uniform in [-1, 1), rounded to the dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <thrust/execution_policy.h>
#include <thrust/tabulate.h>

#include "bench_common.hpp"
#include "decodegraph/numeric.hpp"

namespace dgbench {
namespace {

__device__ __forceinline__ float hash_uniform(unsigned long long i, unsigned long long seed) {
  unsigned long long z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }

/// Element i of the fill: a pure function of (i, seed), so any launch shape gives the same bytes.
template <typename T>
struct RandomElement {
  unsigned long long seed;
  __device__ T operator()(std::ptrdiff_t i) const {
    // Element 0 fixed: never all zeros.
    return from_float<T>(i == 0 ? 0.5f : hash_uniform(static_cast<unsigned long long>(i), seed));
  }
};

/// fp8 caches: element i's code of hash_uniform / kFillKvScale (numeric.hpp's rounding).
struct RandomCode {
  unsigned long long seed;
  decodegraph::KVCacheDType kv;
  __device__ std::uint8_t operator()(std::ptrdiff_t i) const {
    const float v = (i == 0 ? 0.5f : hash_uniform(static_cast<unsigned long long>(i), seed)) / kFillKvScale;
    return kv == decodegraph::KVCacheDType::kFp8E5M2 ? decodegraph::float_to_fp8_e5m2_bits(v)
                                                      : decodegraph::float_to_fp8_e4m3_bits(v);
  }
};

template <typename T>
void fill(void* buf, std::size_t n, unsigned long long seed, cudaStream_t stream) {
  T* p = static_cast<T*>(buf);
  // Thrust: "element i = f(i)" is exactly tabulate; it picks the grid and 32/64-bit indexing (caches
  // pass 2^31 elements), and par_nosync keeps it asynchronous on the caller's stream.
  thrust::tabulate(thrust::cuda::par_nosync.on(stream), p, p + n, RandomElement<T>{seed});
}

}  // namespace

void fill_random_kv_device(const decodegraph::AttentionSpec& spec, void* buf, std::size_t n, std::uint64_t seed,
                           cudaStream_t stream) {
  if (!spec.fp8_kv()) return fill_random_device(spec.dtype, buf, n, seed, stream);
  if (n == 0) return;
  auto* p = static_cast<std::uint8_t*>(buf);
  thrust::tabulate(thrust::cuda::par_nosync.on(stream), p, p + n,
                   RandomCode{seed * 0x2545f4914f6cdd1dull + 1, spec.kv_dtype});
}

void fill_random_device(decodegraph::DType dtype, void* buf, std::size_t n, std::uint64_t seed,
                        cudaStream_t stream) {
  if (n == 0) return;
  const unsigned long long s = seed * 0x2545f4914f6cdd1dull + 1;
  // Thrust reports a failed launch by throwing thrust::system_error: unhandled in a bench, it aborts.
  switch (dtype) {
    case decodegraph::DType::kFloat16: fill<__half>(buf, n, s, stream); break;
    case decodegraph::DType::kBFloat16: fill<__nv_bfloat16>(buf, n, s, stream); break;
    case decodegraph::DType::kFloat32: fill<float>(buf, n, s, stream); break;
  }
}

}  // namespace dgbench
