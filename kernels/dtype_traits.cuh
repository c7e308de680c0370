// Element conversions and 16-byte vector helpers shared by the device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace decodegraph::kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/// Raw storage word of one element (for copies and zero fills without arithmetic).
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;

/// One 16-byte vector viewed as its elements.
template <typename T>
union Chunk {
  uint4 raw;
  Bits<T> bits[16 / sizeof(T)];
};

/// Element e of a 16-byte vector as float.
template <typename T>
__device__ __forceinline__ float chunk_elem(const uint4& raw, int e) {
  Chunk<T> c;
  c.raw = raw;
  T v;
  static_assert(sizeof(T) == sizeof(Bits<T>));
  memcpy(&v, &c.bits[e], sizeof(T));
  return to_float(v);
}

/// Bits of from_float<T>(v).
template <typename T>
__device__ __forceinline__ Bits<T> float_to_bits(float v) {
  const T t = from_float<T>(v);
  Bits<T> b;
  memcpy(&b, &t, sizeof(T));
  return b;
}

}  // namespace decodegraph::kernels
