// The few device operations the kernels need beyond plain C++ and the CUDA intrinsics: asynchronous
// 16-byte copies global -> shared (cp.async, sm_80+) with an L2 evict-first policy (K/V are read
// once per step), their commit / wait groups, and 16-byte shared loads through 32-bit shared
// addresses (the swizzled layouts XOR them).
//
// Under the CPU simulator (tests/sim, which defines DECODEGRAPH_SIM) the same functions come from
// the simulator's model in tests/sim/shim/sim_device_ops.hpp: copies are deferred to the matching
// wait and their destinations poisoned until then, so a missing wait or barrier shows up as NaN.
// Inline PTX cannot compile there, so nothing here can silently escape the simulator.
#pragma once

#if defined(DECODEGRAPH_SIM)
#include "sim_device_ops.hpp"
#else

#include <cuda_runtime.h>

#include <cstdint>

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

}  // namespace decodegraph::kernels::dev

#endif  // DECODEGRAPH_SIM
