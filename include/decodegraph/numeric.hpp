// Bit-exact fp16 / bf16 / fp8 <-> float conversions (round to nearest even), usable on host and
// device. The host implementation, the reference and the tests use them; kernels may use CUDA
// intrinsics, which round identically. The fp8 encoders are the KV append's quantisation (host and
// device run the same code, so they agree bit for bit).
#pragma once

#include <cmath>
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

// ---------------------------------------------------------------- fp8 (the KV cache's codes)
// E4M3FN (OCP): 1-4-3, bias 7, max 448 = 0x7e, no infinities, NaN = S.1111.111, subnormals m * 2^-9.
// E5M2: 1-5-2, bias 15, max 57344 = 0x7b, +-inf = S.11111.00, NaN = S.11111.{01,10,11},
// subnormals m * 2^-16. Decoding is exact (every code is a float). Encoding rounds to nearest even
// and saturates (vLLM's __NV_SATFINITE): a finite value beyond +-max, and +-inf, become +-max, never
// inf; NaN becomes 0x7f (a NaN in both formats).

namespace detail {
template <int M, int kBias>
DG_HD float fp8_decode(uint8_t b, bool has_inf) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t mag = b & 0x7fu;
  const uint32_t exp = mag >> M;
  const uint32_t man = mag & ((1u << M) - 1u);
  constexpr uint32_t kTop = (1u << (7 - M)) - 1u;  // all-ones exponent
  if (has_inf ? exp == kTop : mag == 0x7fu) {
    if (has_inf && man == 0) return bits_float(sign | 0x7f800000u);
    return bits_float(0x7fc00000u);
  }
  if (exp == 0) {  // subnormal: man * 2^(1 - bias - M)
    const float v = static_cast<float>(man) * bits_float(static_cast<uint32_t>(127 + 1 - kBias - M) << 23);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 127u - kBias) << 23) | (man << (23 - M)));
}
template <int M, int kBias>
DG_HD uint8_t fp8_encode(float f, uint32_t max_code) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN
  // The largest finite value, as float bits: exponent and mantissa of max_code.
  const uint32_t max_bits = (((max_code >> M) + 127u - kBias) << 23) | ((max_code & ((1u << M) - 1u)) << (23 - M));
  if (a >= max_bits) return static_cast<uint8_t>(sign | max_code);  // saturate (inf too)
  if (a < (static_cast<uint32_t>(127 + 1 - kBias) << 23)) {
    // Subnormal or zero: |f| in units of the smallest subnormal (an exact power-of-two scaling),
    // rounded to nearest even; 2^M is the smallest normal code, which is right.
    const float q = bits_float(a) * bits_float(static_cast<uint32_t>(127 + kBias - 1 + M) << 23);
    return static_cast<uint8_t>(sign | static_cast<uint32_t>(rintf(q)));
  }
  constexpr uint32_t kShift = 23 - M;
  const uint32_t r = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;  // rne
  uint32_t code = r - ((127u - kBias) << M);
  if (code > max_code) code = max_code;  // rounded up past max
  return static_cast<uint8_t>(sign | code);
}
}  // namespace detail

DG_HD float fp8_e4m3_bits_to_float(uint8_t b) { return detail::fp8_decode<3, 7>(b, false); }
DG_HD float fp8_e5m2_bits_to_float(uint8_t b) { return detail::fp8_decode<2, 15>(b, true); }
/// float -> E4M3FN: round to nearest even, saturated to +-448 (inf too), NaN -> 0x7f.
DG_HD uint8_t float_to_fp8_e4m3_bits(float f) { return detail::fp8_encode<3, 7>(f, 0x7eu); }
/// float -> E5M2: round to nearest even, saturated to +-57344 (inf too), NaN -> 0x7f.
DG_HD uint8_t float_to_fp8_e5m2_bits(float f) { return detail::fp8_encode<2, 15>(f, 0x7bu); }

/// The value of an fp8 code of cache type `kv` (kFp8E4M3 or kFp8E5M2).
inline float fp8_bits_to_float(KVCacheDType kv, uint8_t b) {
  return kv == KVCacheDType::kFp8E5M2 ? fp8_e5m2_bits_to_float(b) : fp8_e4m3_bits_to_float(b);
}
/// The code of f in cache type `kv` (kFp8E4M3 or kFp8E5M2), as the KV append stores x / scale.
inline uint8_t float_to_fp8_bits(KVCacheDType kv, float f) {
  return kv == KVCacheDType::kFp8E5M2 ? float_to_fp8_e5m2_bits(f) : float_to_fp8_e4m3_bits(f);
}

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

/// Reads element i of a KV cache of `spec` as float: the model dtype's value, or an fp8 code's value
/// (unscaled: K = this * k_scale).
inline float load_kv_as_float(const AttentionSpec& spec, const void* base, std::size_t i) {
  if (spec.fp8_kv()) return fp8_bits_to_float(spec.kv_dtype, static_cast<const uint8_t*>(base)[i]);
  return load_as_float(spec.dtype, base, i);
}

/// Writes v into element i of a KV cache of `spec`: rounded to the model dtype, or encoded as fp8
/// (round to nearest even, saturated; unscaled).
inline void store_kv_from_float(const AttentionSpec& spec, void* base, std::size_t i, float v) {
  if (spec.fp8_kv()) {
    static_cast<uint8_t*>(base)[i] = float_to_fp8_bits(spec.kv_dtype, v);
    return;
  }
  store_from_float(spec.dtype, base, i, v);
}

}  // namespace decodegraph
