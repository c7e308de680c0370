// V2 pass 2: merges the fp32 partials of pass 1 into the output.
//
// What it computes. For (sequence, query head) with n = ceil(len / P) live partitions:
// M = max_p m_p, w_p = l_p * exp(m_p - M) (math::partition_weight), out = sum_p w_p o_p / sum_p w_p,
// where o_p = acc_p / l_p is the normalised partial output. A single partition is copied (o_0 is
// already the answer: no extra rounding). An attention sink sigma adds e^(sigma - M) to the
// denominator, once per row (then a single partition is merged like several), with M = max(sigma,
// max_p m_p) (math::merge_max). With a sliding
// window the partitions start at the window's first block (pass 1's), so n = ceil((len - origin) / P).
//
// Mapping. Grid: x = query row x query head (heads fastest: a row's heads are neighbours, as their
// partials are; x has room for 2^31 - 1 blocks where y would stop at 65535 rows), z = slice of 32
// head elements (merge_slices). A block
// is G groups of 8 threads (merge_groups: one group per partition up to 32). Thread j of group g
// owns float4 column j of the slice; group g folds partitions g, g + G, ..., loading kMergeUnroll
// of them (m_p, l_p and its 16-byte column) before it folds them, so a thread has 8 partials' loads
// in flight instead of the serial chain a single fold would be. The groups' sums meet in a fixed
// binary tree: two warp shuffle levels, then the warps' sums through shared memory, folded by
// group 0. The order (kernels/merge_policy.hpp) depends on n alone, so the result is deterministic
// and the same for every launch size: eager == graph, and the host implementation folds the same way.
//
// Output rows are out_stride elements apart (heads contiguous within a row).
//
// Assumptions. Pass 1 wrote partitions 0..n-1 of each live row (the same seq_lens, clamped to
// max_seq_len the same way). Partitions >= n are never read: pass 1 skipped them. partial_out is
// 16-byte aligned (the workspace's sub-buffers are 256-byte aligned) and head_size a multiple of 16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decodegraph/fault.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/device_ops.cuh"
#include "kernels/dtype_traits.cuh"
#include "kernels/kernel_launch.cuh"
#include "kernels/merge_policy.hpp"

namespace decodegraph::kernels {

inline constexpr int kMergeMaxThreads = kMergeFolds * kMergeSliceCols;
inline constexpr int kMergeMaxWarps = kMergeMaxThreads / 32;

// ---------------------------------------------------------------- device body

__device__ __forceinline__ float4 merge_add4(float4 a, float4 b) {
  return float4{a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w};
}

__device__ __forceinline__ float4 merge_shfl_xor4(float4 v, int off) {
  return float4{__shfl_xor_sync(0xffffffffu, v.x, off), __shfl_xor_sync(0xffffffffu, v.y, off),
                __shfl_xor_sync(0xffffffffu, v.z, off), __shfl_xor_sync(0xffffffffu, v.w, off)};
}

template <typename T>
__device__ __forceinline__ void merge_partitions_body(const MergeParams& p) {
  __shared__ float4 s_acc[kMergeMaxWarps][kMergeSliceCols];
  __shared__ float s_wsum[kMergeMaxWarps];
  __shared__ float s_warp_max[kMergeMaxWarps];

  const int q_head = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.num_q_heads));
  const int seq = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.num_q_heads));  // a query row: sequence seq / q_len's token seq % q_len
  const int tid = threadIdx.x;
  const int D = p.head_size;
  const int groups = blockDim.x / kMergeSliceCols;
  const int warps = blockDim.x / 32;
  const int g = tid / kMergeSliceCols;
  const int j = tid % kMergeSliceCols;
  const int col = blockIdx.z * kMergeSliceCols + j;  // float4 column of the row
  const bool has_col = col * 4 < D;

  // NOTE(graph): same length, same clamp as pass 1; block-uniform exits before any barrier.
  int len = p.seq_lens[seq / p.q_len];
  len = len < p.max_seq_len ? len : p.max_seq_len;
  if (len <= 0) return;  // padded row: output untouched
  // Partitions from the window's first block on (pass 1's), and the row's sink (-inf: none).
  const int n = (len - math::window_origin(len, p.window, p.block_size) + p.partition_size - 1) / p.partition_size;
  const float sink = p.sinks != nullptr ? __ldg(p.sinks + q_head) : math::neg_inf();
  const int64_t base = math::partial_index(seq, q_head, 0, p.num_q_heads, p.max_partitions);
  const float* m_row = p.max_logits + base;
  const float* l_row = p.exp_sums + base;
  const float4* o_col = reinterpret_cast<const float4*>(p.partial_out + base * D) + col;  // column of partition 0
  const int row4 = D / 4;  // float4s per partial row
  T* out = static_cast<T*>(p.out) + static_cast<int64_t>(seq) * p.out_stride + static_cast<int64_t>(q_head) * D + col * 4;

  if (n == 1 && sink == math::neg_inf()) {
    if (g == 0 && has_col) {
      const float4 v = __ldg(o_col);
      out[0] = from_float<T>(v.x);
      out[1] = from_float<T>(v.y);
      out[2] = from_float<T>(v.z);
      out[3] = from_float<T>(v.w);
    }
    return;
  }

  // This thread's first kMergeUnroll partitions of its fold (v = g: partitions g, g + groups, ...;
  // groups >= min(n, 32), so the launch's group count changes which thread folds, never what is
  // folded). They do not depend on M, so their loads are issued before the max is known: with
  // n <= groups x kMergeUnroll (256 partitions at 32 groups) one round trip serves the whole merge.
  float m[kMergeUnroll], l[kMergeUnroll];
  float4 o[kMergeUnroll];
  const auto load = [&](int first) {
#pragma unroll
    for (int k = 0; k < kMergeUnroll; ++k) {
      const unsigned part = static_cast<unsigned>(first + k * groups);
      const bool live = part < static_cast<unsigned>(n);
      m[k] = live ? __ldg(m_row + part) : math::neg_inf();
      l[k] = live ? __ldg(l_row + part) : 0.0f;
      o[k] = live && has_col ? __ldg(o_col + part * static_cast<unsigned>(row4)) : float4{0.0f, 0.0f, 0.0f, 0.0f};
    }
  };
  load(g);

  // Global max (exact in any order): the prefetched maxima cover partitions below groups x
  // kMergeUnroll; longer rows read the rest.
  float mx = math::neg_inf();
#pragma unroll
  for (int k = 0; k < kMergeUnroll; ++k) mx = fmaxf(mx, m[k]);
  for (int i = groups * kMergeUnroll + tid; i < n; i += blockDim.x) mx = fmaxf(mx, __ldg(m_row + i));
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (tid % 32 == 0) s_warp_max[tid / 32] = mx;
  __syncthreads();
  float M = math::neg_inf();
  for (int w = 0; w < warps; ++w) M = fmaxf(M, s_warp_max[w]);
  M = math::merge_max(M, sink);  // a sink far above every partition must not overflow e^(sigma - M)

  float4 acc = float4{0.0f, 0.0f, 0.0f, 0.0f};
  float wsum = 0.0f;
  for (int first = g;;) {
#pragma unroll
    for (int k = 0; k < kMergeUnroll; ++k) {
      // math::partition_weight, with the exp computed unconditionally so that it predicates
      // instead of branching (its value is discarded where m = -inf).
      const float e = expf(m[k] - M);
      const float w = m[k] == math::neg_inf() ? 0.0f : l[k] * e;
      if (first + k * groups < n) {  // skipped, not added as zero: the order is n's alone
        wsum += w;
        acc.x = fmaf(w, o[k].x, acc.x);
        acc.y = fmaf(w, o[k].y, acc.y);
        acc.z = fmaf(w, o[k].z, acc.z);
        acc.w = fmaf(w, o[k].w, acc.w);
      }
    }
    first += groups * kMergeUnroll;
    if (first >= n) break;
    load(first);
  }

  // The tree: levels 0 and 1 between the four groups of a warp.
  const int used = n < kMergeFolds ? n : kMergeFolds;
#pragma unroll
  for (int level = 0; level < 2; ++level) {
    const int off = kMergeSliceCols << level;
    const float4 other = merge_shfl_xor4(acc, off);
    const float other_w = __shfl_xor_sync(0xffffffffu, wsum, off);
    if (merge_tree_adds(level, g, used)) {
      acc = merge_add4(acc, other);
      wsum += other_w;
    }
  }
  // Levels 2.. between the warps' sums (group 4w holds warp w's), folded by group 0.
  if (warps > 1) {
    if (g % kMergeGroupsPerWarp == 0) {
      s_acc[tid / 32][j] = acc;
      if (j == 0) s_wsum[tid / 32] = wsum;
    }
    __syncthreads();
    if (g == 0) {
      float4 a[kMergeMaxWarps];
      float ws[kMergeMaxWarps];
#pragma unroll
      for (int w = 0; w < kMergeMaxWarps; ++w) {
        a[w] = w < warps ? s_acc[w][j] : float4{0.0f, 0.0f, 0.0f, 0.0f};
        ws[w] = w < warps ? s_wsum[w] : 0.0f;
      }
#pragma unroll
      for (int step = 1; step < kMergeMaxWarps; step *= 2)
#pragma unroll
        for (int w = 0; w + step < kMergeMaxWarps; w += 2 * step)
          if ((w + step) * kMergeGroupsPerWarp < used) {  // merge_tree_adds at level 2 + log2(step)
            a[w] = merge_add4(a[w], a[w + step]);
            ws[w] += ws[w + step];
          }
      acc = a[0];
      wsum = ws[0];
    }
  }
  if (g == 0 && has_col) {
    const float denom = wsum + math::sink_weight(sink, M);  // the sink, once per row
    out[0] = from_float<T>(math::normalise(acc.x, denom));
    out[1] = from_float<T>(math::normalise(acc.y, denom));
    out[2] = from_float<T>(math::normalise(acc.z, denom));
    out[3] = from_float<T>(math::normalise(acc.w, denom));
  }
}

// ---------------------------------------------------------------- kernel

template <typename T>
__global__ void __launch_bounds__(kMergeMaxThreads) MergePartitionsKernel(const __grid_constant__ MergeParams p) {
  // PDL: pass 1's partials may still be being written; wait before any global access, in every
  // block. The trigger once every block is resident (see PagedDecodeKernel).
  dev::grid_dependency_wait();
  dev::launch_dependents();
  merge_partitions_body<T>(p);
}

// ---------------------------------------------------------------- launcher

template <typename T>
void launch_merge_partitions(const MergeParams& p, cudaStream_t stream) {
  const int threads = merge_threads(p.max_partitions);
  // num_seqs (rows) x num_q_heads <= INT_MAX: detail::validate_v2_args.
  const dim3 grid(static_cast<unsigned>(p.num_q_heads) * static_cast<unsigned>(p.num_seqs), 1u,
                  static_cast<unsigned>(merge_slices(p.head_size)));
  if (fault::should_fail(fault::Site::kKernelLaunch))
    fault::throw_injected(fault::Site::kKernelLaunch, "launch of MergePartitionsKernel");
  launch_kernel(MergePartitionsKernel<T>, grid, dim3(static_cast<unsigned>(threads)), stream, p.programmatic, p,
                "MergePartitionsKernel");
}

}  // namespace decodegraph::kernels
