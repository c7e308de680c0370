// KV append (vLLM reshape_and_cache): writes each new token's K and V rows into its cache slot.
//
// What it computes. For token i with slot s = slot_mapping[i] >= 0: block s / block_size, offset
// s % block_size; key[i] / value[i] ([kv_heads, head_size]) go to that (block, offset) of k_cache /
// v_cache in the spec's layout. A negative slot (padding) is skipped, and so is a slot at or past
// num_blocks * block_size (never written out of bounds; validation with host_slot_mapping rejects
// it). With seq_lens and block tables (the executor's staged inputs) a slot that is not that of
// position seq_len - 1 under the token's row (or whose table entry is a bad block id) is skipped too
// (it would overwrite some other position, perhaps another sequence's); a skipped slot is reported
// in bad_slot (append_report.hpp: one compare per token). key / value rows are key_stride / value_stride elements apart (a fused
// QKV buffer).
//
// Mapping. One block per token; threads over the token's kv_heads x head_size/CE 16-byte chunks.
// K (both layouts) and V (NHD) are stored as 16-byte vectors; V in the vLLM layout
// ([blocks, kv_heads, head_size, block_size]) has the head dimension strided by block_size, so its
// chunk is scattered element by element.
//
// Assumptions. Validated by the launcher (validate_append_args): 16-byte aligned tensors and row
// strides, supported shapes. Distinct tokens are expected to map to distinct slots (as in vLLM),
// otherwise the winner is unspecified.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decodegraph/fault.hpp"
#include "kernels/append_report.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/dtype_traits.cuh"

namespace decodegraph::kernels {

inline constexpr int kAppendThreads = 128;

// ---------------------------------------------------------------- device body

template <typename T>
__device__ __forceinline__ void append_kv_body(const AppendParams& p) {
  constexpr int CE = 16 / sizeof(T);
  const int token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0) return;  // padding token
  const int report =
      check_append_slot(slot, p.num_blocks, p.seq_lens, p.block_tables, p.block_table_stride, p.block_size, token);
  if (report != 0) {  // skipped: outside the cache, not the position's slot, or a bad block id there
    if (p.bad_slot != nullptr && threadIdx.x == 0) atomicCAS(p.bad_slot, 0, report);
    return;
  }
  const int D = p.head_size;
  const int H = p.num_kv_heads;
  const int bs = p.block_size;
  const int64_t blk = slot / bs;
  const int off = static_cast<int>(slot % bs);
  const int per_head = D / CE;
  const T* key = static_cast<const T*>(p.key) + token * p.key_stride;
  const T* value = static_cast<const T*>(p.value) + token * p.value_stride;
  T* k_cache = static_cast<T*>(p.k_cache);
  T* v_cache = static_cast<T*>(p.v_cache);

  for (int c = threadIdx.x; c < H * per_head; c += blockDim.x) {
    const int h = c / per_head;
    const int d = (c % per_head) * CE;
    const uint4 kw = __ldg(reinterpret_cast<const uint4*>(key + h * D + d));
    const uint4 vw = __ldg(reinterpret_cast<const uint4*>(value + h * D + d));
    *reinterpret_cast<uint4*>(k_cache + math::k_offset(p.layout, blk, h, off, d, H, D, bs, CE)) = kw;
    if (p.layout == KVLayout::kNHD) {
      *reinterpret_cast<uint4*>(v_cache + math::v_offset(p.layout, blk, h, off, d, H, D, bs)) = vw;
    } else {
      Chunk<T> vc;
      vc.raw = vw;
      Bits<T>* vb = reinterpret_cast<Bits<T>*>(v_cache);
#pragma unroll
      for (int e = 0; e < CE; ++e) vb[math::v_offset(p.layout, blk, h, off, d + e, H, D, bs)] = vc.bits[e];
    }
  }
}

// ---------------------------------------------------------------- kernel

template <typename T>
__global__ void __launch_bounds__(kAppendThreads) AppendKVKernel(const __grid_constant__ AppendParams p) {
  append_kv_body<T>(p);
}

// ---------------------------------------------------------------- launcher

template <typename T>
void launch_append_kv(const AppendParams& p, cudaStream_t stream) {
  if (fault::should_fail(fault::Site::kKernelLaunch))
    fault::throw_injected(fault::Site::kKernelLaunch, "launch of AppendKVKernel");
  AppendKVKernel<T><<<static_cast<unsigned>(p.num_tokens), kAppendThreads, 0, stream>>>(p);
  DG_CUDA_CHECK_LAUNCH("AppendKVKernel");
}

}  // namespace decodegraph::kernels
