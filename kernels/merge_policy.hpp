// The V2 merge's work split and fold order (kernels/merge_partitions.cuh), in one place for the
// kernel, its launcher, the host implementation (which folds in the same order, so host and device
// agree to fp32 noise) and the planner's cost model (executor/cost_model.cpp). docs/kernels.md, "The
// merge: partitions folded side by side", says why it is shaped this way.
//
// The order, which defines the result bit for bit (for one output element of one (sequence, query
// head) with n >= 2 partitions; n = 1 is a copy of the partial):
//   1. M = max(sink, max_p m_p) (exact in any order; math::merge_max), w_p = math::partition_weight(m_p,
//      l_p, M).
//   2. 32 folds: fold v takes partitions v, v + 32, v + 64, ... in that order,
//      acc_v = fmaf(w_p, o_p, acc_v) and W_v += w_p, both from 0.
//   3. A binary tree over v: at level i (i = 0..4) fold v (a multiple of 2^(i+1)) adds fold
//      v + 2^i, unless that subtree holds no partition (its first fold >= min(n, 32)).
//   4. out = math::normalise(acc_0, W_0 + math::sink_weight(sink, M)): an attention sink enters the
//      denominator here, once per row (never in a partition's exp sum). Without one (sink = -inf)
//      and n = 1 the row is a copy of its partial.
// Folds past n are skipped rather than added as zeros, so that a launch with fewer groups (short
// rows) gives the same bits as one with 32: the order depends on n alone, never on the launch.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "decodegraph/numeric.hpp"
#include "kernels/decode_math.hpp"

namespace decodegraph::kernels {

/// float4 columns of a partial row one block covers (8 x 16 B = 128 B): a group is this many
/// threads, each loading one column of each partition it folds.
inline constexpr int kMergeSliceCols = 8;
inline constexpr int kMergeSliceDims = 4 * kMergeSliceCols;
/// Folds of the order above; a block has at most this many groups (256 threads).
inline constexpr int kMergeFolds = 32;
/// Groups per warp (the tree's first two levels are warp shuffles).
inline constexpr int kMergeGroupsPerWarp = 32 / kMergeSliceCols;
/// Partitions a group loads before it folds them: loads in flight per thread.
inline constexpr int kMergeUnroll = 8;
static_assert(kMergeGroupsPerWarp == 4, "the kernel's shuffles are levels 0 and 1 of the tree");
static_assert((kMergeFolds & (kMergeFolds - 1)) == 0, "the tree is a perfect binary tree");

/// Blocks per (sequence, query head) along grid z: one per 32 head elements.
DG_HD constexpr int merge_slices(int head_size) { return (head_size + kMergeSliceDims - 1) / kMergeSliceDims; }

/// Groups per block for a launch whose rows have at most `max_partitions` partitions: one per
/// partition up to 32 (a power of two, at least one warp's four), so short rows launch small blocks.
DG_HD constexpr int merge_groups(int max_partitions) {
  int g = kMergeGroupsPerWarp;
  while (g < max_partitions && g < kMergeFolds) g *= 2;
  return g;
}
DG_HD constexpr int merge_threads(int max_partitions) { return merge_groups(max_partitions) * kMergeSliceCols; }

/// Step 3's rule: at tree level `level`, the node of fold `v` takes its upper subtree unless that
/// holds no partition (`used` = min(n, 32) folds hold one).
DG_HD constexpr bool merge_tree_adds(int level, int v, int used) { return (((v >> level) | 1) << level) < used; }

/// The merge of one (sequence, query head) row in the order above, on the host: m, l [n],
/// o [n, head_size] (fp32 partials), out [head_size], the row's sink (a natural logit; -inf: none).
/// n >= 1. The host implementation's merge and the simulator tests' expected values.
inline void merge_row_in_kernel_order(const float* m, const float* l, const float* o, int n, int head_size,
                                      float* out, float sink = -INFINITY) {
  if (n == 1 && sink == -INFINITY) {
    for (int d = 0; d < head_size; ++d) out[d] = o[d];
    return;
  }
  float M = math::neg_inf();
  for (int p = 0; p < n; ++p) M = std::fmax(M, m[p]);
  M = math::merge_max(M, sink);
  std::vector<float> w(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) w[p] = math::partition_weight(m[p], l[p], M);
  const int used = n < kMergeFolds ? n : kMergeFolds;
  // Fold v in acc[v * head_size ..]: the same arithmetic per element as the kernel, in an order the
  // compiler can vectorise over d.
  std::vector<float> acc(static_cast<std::size_t>(kMergeFolds) * head_size, 0.0f);
  float w_fold[kMergeFolds] = {};
  for (int v = 0; v < used; ++v) {
    float* a = acc.data() + static_cast<std::ptrdiff_t>(v) * head_size;
    for (int p = v; p < n; p += kMergeFolds) {
      w_fold[v] += w[p];
      const float* op = o + static_cast<std::ptrdiff_t>(p) * head_size;
      for (int d = 0; d < head_size; ++d) a[d] = std::fmaf(w[p], op[d], a[d]);
    }
  }
  for (int level = 0; (1 << level) < kMergeFolds; ++level)
    for (int v = 0; v < kMergeFolds; v += 2 << level)
      if (merge_tree_adds(level, v, used)) {
        w_fold[v] += w_fold[v + (1 << level)];
        float* a = acc.data() + static_cast<std::ptrdiff_t>(v) * head_size;
        const float* b = a + static_cast<std::ptrdiff_t>(1 << level) * head_size;
        for (int d = 0; d < head_size; ++d) a[d] += b[d];
      }
  const float denom = w_fold[0] + math::sink_weight(sink, M);
  for (int d = 0; d < head_size; ++d) out[d] = math::normalise(acc[d], denom);
}

}  // namespace decodegraph::kernels
