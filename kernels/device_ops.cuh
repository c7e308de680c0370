// The few device operations the kernels need beyond plain C++ and the CUDA intrinsics: asynchronous
// 16-byte copies global -> shared (cp.async, sm_80+) with an L2 evict-first policy (K/V are read
// once per step), their commit / wait groups, 16-byte shared loads through 32-bit shared
// addresses (the swizzled layouts XOR them), ex2.approx for the softmax weights and rcp.approx for
// the soft-cap, and for the
// tensor-core math ldmatrix (8x8 matrices of 16-bit elements, shared -> the mma fragment layout) and
// mma.sync.m16n8k16 with fp32 accumulation; for fp8 KV caches, the paired conversion of fp8 codes
// to fp16 (cvt.rn.f16x2.e4m3x2 / .e5m2x2, sm_89+; exact) and two 8-byte cp.async halves of one
// 16-byte stage chunk (vLLM V pages of 8 tokens, whose d-rows are 8 bytes); and griddepcontrol,
// programmatic dependent launch's device side (sm_90+).
//
// Under the CPU simulator (tests/sim, which defines DECODEGRAPH_SIM) the same functions come from
// the simulator's model in tests/sim/shim/sim_device_ops.hpp: copies are deferred to the matching
// wait and their destinations poisoned until then, so a missing wait or barrier shows up as NaN;
// ldmatrix and mma are warp-collective rendezvous there with the PTX fragment layouts.
// Inline PTX cannot compile there, so nothing here can silently escape the simulator.
#pragma once

#if defined(DECODEGRAPH_SIM)
#include "sim_device_ops.hpp"
#else

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "decodegraph's kernels need sm_80 or newer (cp.async)"
#endif

namespace decodegraph::kernels::dev {

/// L2 cache policy for data read once: evict first.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

/// Starts copying 16 bytes from global `src` to shared `dst` (both 16-byte aligned). Only the first
/// `src_bytes` (0..16) are read; the rest of the 16 bytes are zero-filled. With src_bytes = 0 nothing
/// is read (src must still be a valid address). Part of the current (uncommitted) group.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes, uint64_t policy) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(d), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}

/// Starts copying two 8-byte halves into the 16 bytes at shared `dst` (16-byte aligned): bytes 0-7
/// from `src_lo`, 8-15 from `src_hi` (each 8-byte aligned), each reading only its first n_lo / n_hi
/// (0..8) bytes and zero-filling the rest. cp.async.ca (.cg copies 16 bytes only).
__device__ __forceinline__ void cp_async_8x2(void* dst, const void* src_lo, int n_lo, const void* src_hi, int n_hi,
                                             uint64_t policy) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 8, %2, %3;\n" ::"r"(d), "l"(src_lo),
               "r"(n_lo), "l"(policy)
               : "memory");
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 8, %2, %3;\n" ::"r"(d + 8), "l"(src_hi),
               "r"(n_hi), "l"(policy)
               : "memory");
}

// ---------------------------------------------------------------- programmatic dependent launch
// PTX ISA, "griddepcontrol" (sm_90+). Below sm_90 there is no PDL: a launch is fully ordered after
// its predecessor, and both are no-ops. Both are no-ops too when the launch was not programmatic.

/// griddepcontrol.wait: blocks this thread until every prerequisite grid has completed and its
/// memory operations are visible. Every kernel of ours calls it before its first global read or
/// store; the memory clobber keeps the compiler from hoisting a load above it.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// griddepcontrol.launch_dependents: once every block of this grid has issued it (or exited), a
/// programmatic dependent may be scheduled. A hint only: it never makes our writes visible early.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Closes the current group of copies.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/// Waits until at most N of this thread's committed groups are still in flight. Other threads see
/// the copied data only after a barrier that follows their writers' waits.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// A shared-memory address as the hardware sees it (32 bits): cheap to add to and XOR with.
using SmemAddr = uint32_t;
__device__ __forceinline__ SmemAddr smem_addr(const void* p) {
  return static_cast<SmemAddr>(__cvta_generic_to_shared(p));
}

/// 16-byte shared-memory load.
__device__ __forceinline__ uint4 lds16(SmemAddr a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}

/// 2^x: ex2.approx.ftz.f32, one MUFU.EX2 (exp2f's accurate path adds a range check and two
/// multiplies around it). PTX ISA 9.1, "ex2": at most 2 ulp from the correctly rounded result over
/// the full range; .ftz flushes subnormal inputs and results to sign-preserving zero; 2^-inf = +0,
/// 2^+-0 = 1, 2^+inf = +inf, NaN stays NaN. The simulator models exactly that (sim_device_ops.hpp).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// 1 / x: rcp.approx.ftz.f32, one MUFU.RCP (the soft-cap's reciprocal). PTX ISA 9.1, "rcp": at
/// most 1 ulp of error over the full range; .ftz flushes subnormal inputs and results to
/// sign-preserving zero; 1 / +-0 = +-inf, 1 / +-inf = +-0. The simulator models exactly that.
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------- tensor cores (sm_80+)
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and
// "ldmatrix"), with g = lane / 4 and t = lane % 4; a 32-bit register holds two 16-bit elements, the
// lower-indexed one in the low half:
//   A (16x16, row-major), a[0..3]: (row g, cols 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)
//   B (16x8, "col"), b0, b1: (rows k = 2t..2t+1, col g), (k = 2t + 8..2t + 9, col g)
//   C/D (16x8 fp32), d[0..3]: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
//   ldmatrix, per 8x8 matrix: lane l gives row l % 8 of matrix l / 8 (.x4; .x2 reads lanes 0-15's);
//   register m of lane (g, t) = elements (row g, cols 2t, 2t+1) of matrix m; with .trans
//   (rows 2t, 2t+1; col g).

/// ldmatrix.sync.aligned.m8n8.x{N}{.trans}.shared.b16 into r[0..N-1] (N = 2 or 4). Every lane of
/// the warp executes it; `a` is this lane's row address (16-byte aligned).
template <int N, bool kTrans>
__device__ __forceinline__ void ldmatrix(uint32_t* r, SmemAddr a) {
  static_assert(N == 2 || N == 4, "ldmatrix .x2 or .x4");
  if constexpr (N == 4 && !kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else if constexpr (N == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else if constexpr (!kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

/// d += A * B: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (T = __nv_bfloat16
/// or __half), fragments as above. Every lane of the warp executes it. volatile, as CUTLASS's are:
/// the compiler must neither drop nor merge it (it is warp-collective).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------- fp8 codes (KV caches)

/// Four fp8 codes (KV = __nv_fp8_e4m3 or __nv_fp8_e5m2; byte i = code i) as two fp16 pairs: lo =
/// codes 0, 1 and hi = codes 2, 3, code 0 / 2 in the low half. Exact: every E4M3 and E5M2 value is
/// an fp16 value (NaN stays NaN, E5M2's infinities stay infinite). sm_89+: one
/// cvt.rn.f16x2.{e4m3x2,e5m2x2} per pair; sm_80 (no fp8 conversions): CUDA's own software path.
template <typename KV>
__device__ __forceinline__ void fp8x4_to_half2x2(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  static_assert(std::is_same_v<KV, __nv_fp8_e4m3> || std::is_same_v<KV, __nv_fp8_e5m2>, "fp8 code type");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (std::is_same_v<KV, __nv_fp8_e4m3>)
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(codes));
  else
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 %0, l;\n cvt.rn.f16x2.e5m2x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(codes));
#else
  constexpr __nv_fp8_interpretation_t kInterp = std::is_same_v<KV, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xffffu), kInterp);
  const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes >> 16), kInterp);
  lo = static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(a.y) << 16);
  hi = static_cast<uint32_t>(b.x) | (static_cast<uint32_t>(b.y) << 16);
#endif
}

/// Bytes (0, 2, 1, 3) of x: a register that ldmatrix.trans filled with 2 tokens x 2 codes
/// (token 2t: d 2g, 2g + 1; token 2t + 1: the same d) as (d 2g: both tokens, d 2g + 1: both).
__device__ __forceinline__ uint32_t interleave_pairs(uint32_t x) { return __byte_perm(x, 0u, 0x3120); }

}  // namespace decodegraph::kernels::dev

#endif  // DECODEGRAPH_SIM
