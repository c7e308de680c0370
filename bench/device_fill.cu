// Seeded random fill of device buffers, so caches of tens of GB fill at memory speed instead of
// being generated on the host and copied. Values are uniform in [-1, 1), rounded to the dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bench_common.hpp"

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

template <typename T>
__global__ void FillRandomKernel(T* buf, std::size_t n, unsigned long long seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    buf[i] = from_float<T>(i == 0 ? 0.5f : hash_uniform(i, seed));  // element 0 fixed: never all zeros
}

}  // namespace

void fill_random_device(decodegraph::DType dtype, void* buf, std::size_t n, std::uint64_t seed,
                        cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  const int blocks = 132 * 16;  // grid-stride; enough to saturate any current GPU
  const unsigned long long s = seed * 0x2545f4914f6cdd1dull + 1;
  switch (dtype) {
    case decodegraph::DType::kFloat16:
      FillRandomKernel<<<blocks, threads, 0, stream>>>(static_cast<__half*>(buf), n, s);
      break;
    case decodegraph::DType::kBFloat16:
      FillRandomKernel<<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(buf), n, s);
      break;
    case decodegraph::DType::kFloat32:
      FillRandomKernel<<<blocks, threads, 0, stream>>>(static_cast<float*>(buf), n, s);
      break;
  }
  DGB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dgbench
