// Element conversions and 16-byte vector helpers shared by the device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "decodegraph/numeric.hpp"

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
using Bits = std::conditional_t<sizeof(T) == 1, uint8_t, std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>>;

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


/// Two floats rounded to T and packed into 32 bits, `lo` in the low half (the order of an mma
/// fragment register). T = __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t w;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&w, &h, sizeof w);
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "pack_pair: 16-bit types only");
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&w, &h, sizeof w);
  }
  return w;
}

// ---------------------------------------------------------------- 16-byte chunks as floats

/// Word w (0..3) of a 16-byte vector.
__device__ __forceinline__ uint32_t chunk_word(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

/// Unpacks / packs a 16-byte chunk of T as floats (half2 / bf16x2 at a time for the 16-bit types).
/// `out` has 16 / sizeof(T) elements.
template <typename T>
struct ChunkConvert;

template <>
struct ChunkConvert<float> {
  static constexpr int kElems = 4;
  static __device__ __forceinline__ void unpack(const uint4& v, float (&out)[4]) {
#pragma unroll
    for (int w = 0; w < 4; ++w) out[w] = decodegraph::bits_float(chunk_word(v, w));
  }
  static __device__ __forceinline__ uint4 pack(const float (&in)[4]) {
    return make_uint4(decodegraph::float_bits(in[0]), decodegraph::float_bits(in[1]),
                      decodegraph::float_bits(in[2]), decodegraph::float_bits(in[3]));
  }
};

template <>
struct ChunkConvert<__half> {
  static constexpr int kElems = 8;
  static __device__ __forceinline__ void unpack(const uint4& v, float (&out)[8]) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t word = chunk_word(v, w);
      __half2 h;
      memcpy(&h, &word, sizeof h);
      const float2 f = __half22float2(h);
      out[2 * w] = f.x;
      out[2 * w + 1] = f.y;
    }
  }
  static __device__ __forceinline__ uint4 pack(const float (&in)[8]) {
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const __half2 h = __floats2half2_rn(in[2 * w], in[2 * w + 1]);
      memcpy(&words[w], &h, sizeof h);
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
  }
};

template <>
struct ChunkConvert<__nv_bfloat16> {
  static constexpr int kElems = 8;
  // bf16 is the high half of an fp32: a shift for the low element, a mask for the high one (two
  // instructions per pair; __bfloat1622float2 spends three).
  static __device__ __forceinline__ void unpack(const uint4& v, float (&out)[8]) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t word = chunk_word(v, w);
      out[2 * w] = decodegraph::bits_float(word << 16);
      out[2 * w + 1] = decodegraph::bits_float(word & 0xffff0000u);
    }
  }
  static __device__ __forceinline__ uint4 pack(const float (&in)[8]) {
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * w], in[2 * w + 1]);
      memcpy(&words[w], &h, sizeof h);
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
  }
};

}  // namespace decodegraph::kernels
