// The simulator's model of kernels/device_ops.cuh (included from there under DECODEGRAPH_SIM).
// cp.async: each copy is checked when issued (source inside an allocation and 16-byte aligned,
// destination inside a __shared__ array and 16-byte aligned, 0..16 source bytes), its destination
// is filled with NaN bytes at once, and the data lands only when the issuing thread waits for the
// copy's group, visible to the issuing thread only until the next barrier (sim_runtime.cpp,
// "cp.async visibility"); reading a stage before its wait and barrier, or refilling one that
// another thread still reads, fails. A thread that exits with copies it never waited for fails the
// test. lds16 checks that it reads inside a __shared__ array. Both report their
// shared address to the bank-conflict model. ldmatrix and mma are warp-collective rendezvous with
// the PTX fragment layouts (sim_runtime.cpp, "tensor cores"); each lane's ldmatrix row address is a
// shared access for the bank-conflict model too (one 8x8 matrix = one 8-lane phase). ex2 models
// ex2.approx.ftz.f32 at its documented 2-ulp worst, rcp rcp.approx.ftz.f32 at its 1-ulp worst. The fp8 -> fp16 conversions are exact, as the
// hardware's cvt.rn.f16x2.{e4m3x2,e5m2x2} are (every fp8 value is an fp16 value); the two 8-byte
// cp.async halves of one chunk are one copy of the chunk for the visibility model.
// griddepcontrol.wait / .launch_dependents: the programmatic-dependent-launch model
// (sim_runtime.cpp, "programmatic dependent launch").
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_fp8.h"
#include "sim_runtime.hpp"

namespace decodegraph::kernels::dev {

inline uint64_t evict_first_policy() { return 0; }

inline void grid_dependency_wait() { sim::grid_dependency_wait(); }
inline void launch_dependents() { sim::launch_dependents(); }  // no cache model: the hint is accepted and ignored

// `site` (the caller's line) identifies the instruction for the bank-conflict check.
inline void cp_async_16(void* dst, const void* src, int src_bytes, uint64_t /*policy*/,
                        unsigned site = __builtin_LINE()) {
  sim::cp_async(dst, src, src_bytes);
  sim::shared_access(dst, site);
}
inline void cp_async_8x2(void* dst, const void* src_lo, int n_lo, const void* src_hi, int n_hi, uint64_t /*policy*/,
                         unsigned site = __builtin_LINE()) {
  sim::cp_async_halves(dst, src_lo, n_lo, src_hi, n_hi);
  sim::shared_access(dst, site);
}
inline void cp_async_commit() { sim::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  static_assert(N >= 0, "wait_group takes a non-negative count");
  sim::cp_async_wait(N);
}

// A host address: XORing its low bits moves within an aligned block exactly as on the device, as
// long as the __shared__ array is as aligned as the kernel declares (alignas survives the transform).
using SmemAddr = uintptr_t;
inline SmemAddr smem_addr(const void* p) { return reinterpret_cast<SmemAddr>(p); }

inline uint4 lds16(SmemAddr a, unsigned site = __builtin_LINE()) {
  const void* src = reinterpret_cast<const void*>(a);
  sim::shared_load16(src, "lds16");
  sim::shared_access(src, site);
  uint4 v;
  std::memcpy(&v, src, sizeof v);
  return v;
}

// ex2.approx.ftz.f32 at its documented worst (PTX ISA 9.1, "ex2": at most 2 ulp from the
// correctly rounded result, subnormal inputs and results flushed to sign-preserving zero): the
// correctly rounded 2^x moved by exactly 2 ulp, up or down as a hash of x's bits says, so the error
// tests see the hardware's largest error, with no bias to cancel in the normalisation (0, inf and
// NaN results are exact).
inline float ex2(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0) x = 0.0f;  // .ftz: a subnormal input counts as (signed) zero
  const float y = static_cast<float>(std::exp2(static_cast<double>(x)));
  if (!(y >= 1.17549435e-38f) || y == INFINITY) return y < 1.17549435e-38f ? 0.0f : y;  // .ftz result, inf, NaN
  uint32_t h = u * 0x9e3779b1u;
  h ^= h >> 15;
  uint32_t b;
  std::memcpy(&b, &y, sizeof b);
  b = (h & 1u) ? b + 2 : b - 2;
  float r;
  std::memcpy(&r, &b, sizeof r);
  return r;
}

// rcp.approx.ftz.f32 at its documented worst (PTX ISA 9.1, "rcp": at most 1 ulp of error, subnormal
// inputs and results flushed to sign-preserving zero): the correctly rounded 1 / x moved by exactly
// 1 ulp, up or down as a hash of x's bits says (0, inf and NaN results are exact).
inline float rcp(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0) x = std::signbit(x) ? -0.0f : 0.0f;  // .ftz input
  const float y = static_cast<float>(1.0 / static_cast<double>(x));
  if (std::isnan(y) || std::isinf(y)) return y;
  if (std::fabs(y) < 1.17549435e-38f) return std::signbit(y) ? -0.0f : 0.0f;  // .ftz result
  uint32_t h = u * 0x85ebca6bu;
  h ^= h >> 13;
  uint32_t b;
  std::memcpy(&b, &y, sizeof b);
  b = (h & 1u) ? b + 1 : b - 1;
  float r;
  std::memcpy(&r, &b, sizeof r);
  return r;
}

template <int N, bool kTrans>
inline void ldmatrix(uint32_t* r, SmemAddr a, unsigned site = __builtin_LINE()) {
  static_assert(N == 2 || N == 4, "ldmatrix .x2 or .x4");
  sim::ldmatrix(N, kTrans, r, reinterpret_cast<const void*>(a), site);
}

template <typename T>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                         unsigned site = __builtin_LINE()) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "mma takes fp16 / bf16");
  sim::mma_m16n8k16(std::is_same_v<T, __nv_bfloat16>, d, a, b0, b1, site);
}

// fp8 codes -> fp16 pairs, exact (decodegraph/numeric.hpp decodes; every value is an fp16 value, so
// rounding it to fp16 changes nothing; NaN stays NaN, E5M2's infinities stay infinite).
template <typename KV>
inline void fp8x4_to_half2x2(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  static_assert(std::is_same_v<KV, __nv_fp8_e4m3> || std::is_same_v<KV, __nv_fp8_e5m2>, "fp8 code type");
  uint32_t h[4];
  for (int i = 0; i < 4; ++i) {
    const uint8_t b = static_cast<uint8_t>(codes >> (8 * i));
    const float f = std::is_same_v<KV, __nv_fp8_e4m3> ? decodegraph::fp8_e4m3_bits_to_float(b)
                                                      : decodegraph::fp8_e5m2_bits_to_float(b);
    h[i] = decodegraph::float_to_fp16_bits(f);
  }
  lo = h[0] | (h[1] << 16);
  hi = h[2] | (h[3] << 16);
}

inline uint32_t interleave_pairs(uint32_t x) {  // bytes (0, 2, 1, 3), as __byte_perm(x, 0, 0x3120)
  return (x & 0xff0000ffu) | ((x & 0x0000ff00u) << 8) | ((x & 0x00ff0000u) >> 8);
}

}  // namespace decodegraph::kernels::dev
