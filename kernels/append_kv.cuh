// KV append (vLLM reshape_and_cache): writes each new token's K and V rows into its cache slot.
//
// What it computes. For token i with slot s = slot_mapping[i] >= 0: block s / block_size, offset
// s % block_size; key[i] / value[i] ([kv_heads, head_size]) go to that (block, offset) of k_cache /
// v_cache in the spec's layout. A negative slot (padding) is skipped, and so is a slot at or past
// num_blocks * block_size (never written out of bounds; validation with host_slot_mapping rejects
// it). With seq_lens and block tables (the executor's staged inputs; one row per tokens_per_seq
// consecutive tokens, token j of a sequence at position seq_len - tokens_per_seq + j) a slot that is
// not that of its position under its sequence's row (or whose table entry is a bad block id) is skipped too
// (it would overwrite some other position, perhaps another sequence's); a skipped slot is reported
// in bad_slot (append_report.hpp: one compare per token). key / value rows are key_stride / value_stride elements apart (a fused
// QKV buffer).
//
// fp8 caches quantise: each element becomes the code of x / scale (fp32 division, then round to
// nearest even, saturated to +-max, NaN -> 0x7f: float_to_fp8_*_bits in numeric.hpp, the host
// append's own function, so both write the same bits); scale = k_scale / v_scale [0 or the head].
//
// Mapping. One block per token; threads over the token's kv_heads x head_size/CE 16-byte chunks of
// the cache (CE = 16 / cache element size: 16 codes for fp8, read from 32 bytes of key / value).
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
#include <type_traits>

#include "decodegraph/fault.hpp"
#include "kernels/append_report.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/device_ops.cuh"
#include "kernels/dtype_traits.cuh"
#include "kernels/kernel_launch.cuh"

namespace decodegraph::kernels {

inline constexpr int kAppendThreads = 128;

// ---------------------------------------------------------------- device body

/// One 16-byte chunk of cache elements from CE = 16 / sizeof(KV) input elements at `src`: the
/// input's bits (KV = T), or the fp8 codes of x / scale.
template <typename T, typename KV>
__device__ __forceinline__ uint4 append_chunk(const T* src, float scale) {
  constexpr int CE = 16 / sizeof(KV);
  if constexpr (std::is_same_v<T, KV>) {
    return __ldg(reinterpret_cast<const uint4*>(src));
  } else {
    static_assert(sizeof(KV) == 1 && sizeof(T) == 2, "fp8 caches take fp16 / bf16 key and value");
    Chunk<uint8_t> out;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(src) + half);
      Chunk<T> in;
      in.raw = w;
#pragma unroll
      for (int e = 0; e < CE / 2; ++e) {
        T v;
        memcpy(&v, &in.bits[e], sizeof v);
        const float x = to_float(v) / scale;
        out.bits[half * (CE / 2) + e] = std::is_same_v<KV, __nv_fp8_e5m2> ? float_to_fp8_e5m2_bits(x)
                                                                           : float_to_fp8_e4m3_bits(x);
      }
    }
    return out.raw;
  }
}

template <typename T, typename KV>
__device__ __forceinline__ void append_kv_body(const AppendParams& p) {
  constexpr int CE = 16 / sizeof(KV);
  const int token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0) return;  // padding token
  const int report =
      check_append_slot(slot, p.num_blocks, p.seq_lens, p.block_tables, p.block_table_stride, p.block_size, token,
                        p.tokens_per_seq);
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
  KV* k_cache = static_cast<KV*>(p.k_cache);
  KV* v_cache = static_cast<KV*>(p.v_cache);

  for (int c = threadIdx.x; c < H * per_head; c += blockDim.x) {
    const int h = c / per_head;
    const int d = (c % per_head) * CE;
    float ks = 1.0f, vs = 1.0f;
    if constexpr (!std::is_same_v<T, KV>) {
      const int si = p.scale_per_head ? h : 0;
      ks = __ldg(p.k_scale + si);
      vs = __ldg(p.v_scale + si);
    }
    const uint4 kw = append_chunk<T, KV>(key + h * D + d, ks);
    const uint4 vw = append_chunk<T, KV>(value + h * D + d, vs);
    *reinterpret_cast<uint4*>(k_cache + math::k_offset(p.layout, blk, h, off, d, H, D, bs, CE)) = kw;
    if (p.layout == KVLayout::kNHD) {
      *reinterpret_cast<uint4*>(v_cache + math::v_offset(p.layout, blk, h, off, d, H, D, bs)) = vw;
    } else {
      Chunk<KV> vc;
      vc.raw = vw;
      Bits<KV>* vb = reinterpret_cast<Bits<KV>*>(v_cache);
#pragma unroll
      for (int e = 0; e < CE; ++e) vb[math::v_offset(p.layout, blk, h, off, d + e, H, D, bs)] = vc.bits[e];
    }
  }
}

// ---------------------------------------------------------------- kernel

template <typename T, typename KV>
__global__ void __launch_bounds__(kAppendThreads) AppendKVKernel(const __grid_constant__ AppendParams p) {
  // PDL: the new K/V (the caller's projection) and the slots (staging copies) may still be being
  // written, and the previous layer's pass 1 may still read the cache: wait before any global
  // access, in every block. The trigger once every block is resident (see PagedDecodeKernel).
  dev::grid_dependency_wait();
  dev::launch_dependents();
  append_kv_body<T, KV>(p);
}

// ---------------------------------------------------------------- launcher

template <typename T, typename KV>
void launch_append_kv(const AppendParams& p, cudaStream_t stream) {
  if (fault::should_fail(fault::Site::kKernelLaunch))
    fault::throw_injected(fault::Site::kKernelLaunch, "launch of AppendKVKernel");
  launch_kernel(AppendKVKernel<T, KV>, dim3(static_cast<unsigned>(p.num_tokens)), dim3(kAppendThreads), stream,
                p.programmatic, p, "AppendKVKernel");
}

}  // namespace decodegraph::kernels
