// Bit-exact fp16 / bf16 <-> float conversions (round to nearest even), usable on host and device.
// The host implementation, the reference and the tests use them; kernels may use CUDA intrinsics,
// which round identically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "decodegraph/types.hpp"

#if defined(__CUDACC__)
#define DG_HD __host__ __device__ __forceinline__
#else
#define DG_HD inline
#endif

namespace decodegraph {

DG_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

DG_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// float -> IEEE binary16, round to nearest even; overflow to inf, NaN stays NaN.
DG_HD uint16_t float_to_fp16_bits(float f) {
  const uint32_t f32_infty = 255u << 23;
  const uint32_t f16_max = (127u + 16u) << 23;                          // 2^16: at or above -> inf
  const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;  // 0.5 * 2^-14 ulp shift
  uint32_t u = float_bits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t o;
  if (u >= f16_max) {
    o = (u > f32_infty) ? 0x7e00 : 0x7c00;
  } else if (u < (113u << 23)) {  // result is subnormal or zero: let float addition round it
    const float t = bits_float(u) + bits_float(denorm_magic);
    o = static_cast<uint16_t>(float_bits(t) - denorm_magic);
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    u += mant_odd;
    o = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

DG_HD float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// float -> bfloat16, round to nearest even; NaN stays NaN.
DG_HD uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

DG_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

/// Reads element i of a buffer of `dtype` as float.
inline float load_as_float(DType dtype, const void* base, std::size_t i) {
  switch (dtype) {
    case DType::kFloat16: return fp16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat32: return static_cast<const float*>(base)[i];
  }
  return 0.0f;
}

/// Writes v, rounded to `dtype`, into element i.
inline void store_from_float(DType dtype, void* base, std::size_t i, float v) {
  switch (dtype) {
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = float_to_fp16_bits(v); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v); break;
    case DType::kFloat32: static_cast<float*>(base)[i] = v; break;
  }
}

}  // namespace decodegraph
