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
/// q_len query rows per sequence: a KV head serves pass1_rows(group, q_len) rows, which select the
/// math and the block size (launch_paged_decode), so q_len 4 at GQA 2 runs on tensor cores.
KernelResources pass1_resources(const AttentionSpec& spec, int q_len = 1);

/// Head chunks of the pass-1 launch: a block serves at most 16 query rows of a KV head, more split
/// into balanced chunks (decode_policy.hpp), so grid y = num_kv_heads x this. With q_len rows (GQA 8
/// x q_len 4 is 32 rows: 2 chunks) each chunk's blocks read the KV head's K and V again.
int pass1_head_chunks(const AttentionSpec& spec, int q_len = 1);

/// CUDA: cudaOccupancyMaxActiveBlocksPerMultiprocessor for the exact kernel, block size and dynamic
/// shared memory (none) the launcher uses for `spec` at q_len rows, on the current device. Not
/// capture-sensitive (no launch), but call it outside any capture anyway. Throws Error when built
/// without CUDA.
int pass1_blocks_per_sm_on_device(const AttentionSpec& spec, int q_len = 1);

}  // namespace decodegraph::kernels
