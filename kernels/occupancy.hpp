// Occupancy of the pass-1 kernel (V1 / V2 pass 1): the resources of the instantiation a spec
// selects, and how many of its blocks an SM holds. The planner turns this into target_blocks =
// blocks_per_sm x SMs. Host code: builds with or without CUDA.
#pragma once

#include "decodegraph/types.hpp"

namespace decodegraph::kernels {

/// What one block of a kernel holds on an SM.
struct KernelResources {
  int threads = 0;
  int registers = 0;   // per thread
  int smem_bytes = 0;  // static + dynamic shared memory per block
};

/// Per-SM limits of a GPU. Defaults: sm_90 (H100 / H200).
struct SmLimits {
  int max_threads = 2048;
  int max_blocks = 32;
  int registers = 65536;
  int smem_bytes = 233472;         // 228 KiB per SM
  int smem_reserved_per_block = 1024;  // the runtime reserves 1 KiB per resident block
  int smem_alloc_unit = 128;
  int reg_alloc_unit = 256;        // registers are allocated per warp in units of 256
};

/// Theoretical resident blocks per SM (0 when a block does not fit at all).
int blocks_per_sm(const KernelResources& r, const SmLimits& limits = {});

/// Host model: resources of the pass-1 instantiation `spec` selects (dtype, head size, layout; the
/// block size follows the GQA group), as nvcc 13.0 compiles it for sm_90: registers read off
/// `-Xptxas -v` (re-read them whenever the kernel changes: scripts/kernel_report.sh prints them),
/// static shared memory from the policy (decode_policy.hpp), no dynamic shared memory.
KernelResources pass1_resources(const AttentionSpec& spec);

/// Head chunks of the pass-1 launch: a block serves at most 16 query heads of a GQA group, larger
/// groups split into balanced chunks (decode_policy.hpp), so grid y = num_kv_heads x this.
int pass1_head_chunks(const AttentionSpec& spec);

/// CUDA: cudaOccupancyMaxActiveBlocksPerMultiprocessor for the exact kernel, block size and dynamic
/// shared memory (none) the launcher uses for `spec`, on the current device. Not capture-sensitive
/// (no launch), but call it outside any capture anyway. Throws Error when built without CUDA.
int pass1_blocks_per_sm_on_device(const AttentionSpec& spec);

}  // namespace decodegraph::kernels
