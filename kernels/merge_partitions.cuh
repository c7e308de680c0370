// V2 pass 2: merges the fp32 partials of pass 1 into the output.
//
// What it computes. For (sequence, query head) with n = ceil(len / P) live partitions:
// M = max_p m_p, w_p = l_p * exp(m_p - M) (math::partition_weight), out = sum_p w_p o_p / sum_p w_p,
// where o_p = acc_p / l_p is the normalised partial output. A single partition is copied (o_0 is
// already the answer: no extra rounding).
//
// Mapping. Grid: x = query head, y = sequence. Block = head_size rounded up to a warp (<= 256);
// thread d owns output element d. Weights are computed cooperatively in chunks of kChunk partitions
// into shared memory, then every thread folds them in partition order, so the result is
// deterministic and every thread sees the same sum of weights.
//
// Output rows are out_stride elements apart (heads contiguous within a row).
//
// Assumptions. Pass 1 wrote partitions 0..n-1 of each live row (the same seq_lens, clamped to
// max_seq_len the same way). Partitions >= n are never read: pass 1 skipped them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decodegraph/fault.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/dtype_traits.cuh"

namespace decodegraph::kernels {

inline constexpr int kMergeChunk = 256;
inline constexpr int kMergeMaxThreads = 256;

// ---------------------------------------------------------------- device body

template <typename T>
__device__ __forceinline__ void merge_partitions_body(const MergeParams& p) {
  __shared__ float s_w[kMergeChunk];
  __shared__ float s_warp_max[kMergeMaxThreads / 32];

  const int q_head = blockIdx.x;
  const int seq = blockIdx.y;
  const int tid = threadIdx.x;
  const int D = p.head_size;

  // NOTE(graph): same length, same clamp as pass 1; block-uniform exits before any barrier.
  int len = p.seq_lens[seq];
  len = len < p.max_seq_len ? len : p.max_seq_len;
  if (len <= 0) return;  // padded row: output untouched
  const int n = (len + p.partition_size - 1) / p.partition_size;
  const int64_t base = math::partial_index(seq, q_head, 0, p.num_q_heads, p.max_partitions);
  T* out = static_cast<T*>(p.out) + seq * p.out_stride + static_cast<int64_t>(q_head) * D;

  if (n == 1) {
    if (tid < D) out[tid] = from_float<T>(p.partial_out[base * D + tid]);
    return;
  }

  // Global max (exact in any order).
  float mx = math::neg_inf();
  for (int i = tid; i < n; i += blockDim.x) mx = fmaxf(mx, p.max_logits[base + i]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (tid % 32 == 0) s_warp_max[tid / 32] = mx;
  __syncthreads();
  float M = math::neg_inf();
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) M = fmaxf(M, s_warp_max[w]);

  float acc = 0.0f;
  float wsum = 0.0f;
  for (int c0 = 0; c0 < n; c0 += kMergeChunk) {
    const int cn = n - c0 < kMergeChunk ? n - c0 : kMergeChunk;
    __syncthreads();  // previous chunk consumed
    for (int i = tid; i < cn; i += blockDim.x)
      s_w[i] = math::partition_weight(p.max_logits[base + c0 + i], p.exp_sums[base + c0 + i], M);
    __syncthreads();
    for (int i = 0; i < cn; ++i) {
      const float w = s_w[i];
      wsum += w;
      if (tid < D) acc = fmaf(w, p.partial_out[(base + c0 + i) * D + tid], acc);
    }
  }
  if (tid < D) out[tid] = from_float<T>(math::normalise(acc, wsum));
}

// ---------------------------------------------------------------- kernel

template <typename T>
__global__ void __launch_bounds__(kMergeMaxThreads) MergePartitionsKernel(const __grid_constant__ MergeParams p) {
  merge_partitions_body<T>(p);
}

// ---------------------------------------------------------------- launcher

template <typename T>
void launch_merge_partitions(const MergeParams& p, cudaStream_t stream) {
  const int threads = (p.head_size + 31) / 32 * 32;
  const dim3 grid(static_cast<unsigned>(p.num_q_heads), static_cast<unsigned>(p.num_seqs));
  if (fault::should_fail(fault::Site::kKernelLaunch))
    fault::throw_injected(fault::Site::kKernelLaunch, "launch of MergePartitionsKernel");
  MergePartitionsKernel<T><<<grid, threads, 0, stream>>>(p);
  DG_CUDA_CHECK_LAUNCH("MergePartitionsKernel");
}

}  // namespace decodegraph::kernels
