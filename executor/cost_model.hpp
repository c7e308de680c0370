// The planner's cost model (internal; docs/planning.md, "The cost model"): the predicted time of one
// attention call (V1, or V2 pass 1 + merge) of a plan's launch when every sequence of the batch has
// the same length. Host-only arithmetic: no backend, no memory. Every number it assumes about the
// GPU's speed is in CostConstants; the kernels' shapes come from the device model (resident pass-1
// blocks) and kernels/merge_policy.hpp.
#pragma once

#include "decodegraph/executor.hpp"

namespace decodegraph::detail {

/// The model's constants, in one place. None is measured yet: each is an estimate, with the
/// measurement that will set it (bench/gpu_check.sh runs on an H200). Times in microseconds,
/// bandwidths in GB/s (1 GB/s = 1,000 bytes per microsecond).
struct CostConstants {
  /// The roof: the GPU's streaming read bandwidth. Estimate: an H200's 4.3 TB/s (issue 19's
  /// analysis). To be measured by bench/gpu_check.sh (decode_loop's read-bandwidth kernel, reported
  /// as "read GB/s" beside every run).
  double read_gbs = 4300;
  /// One pass-1 block streaming alone: K+V bytes per microsecond it consumes when nothing else
  /// competes. Estimate from the sm_90 SASS (issue 19): the tensor-core math takes ~1,000 cycles per
  /// 16-token tile (8 KB of K+V at bf16, head 128), at 1.98 GHz 16.2 GB/s, so ~2 resident blocks per
  /// SM reach the roof. To be measured by decode_loop at batch 1 with one partition per SM (132
  /// blocks), KV bytes / time / 132.
  double block_gbs = 16.2;
  /// A pass-1 block's time outside its stream: the q load and the first tile's DRAM round trip
  /// (~700 cycles each, overlapped), the epilogue's stores of the partials. To be measured by
  /// decode_loop at batch 1 with P = block_size x 1 and x 2 (the difference isolates it).
  double block_fixed_us = 0.5;
  /// A block past its sequence's length: it reads the length and exits (one L2 round trip). To be
  /// measured by decode_loop over a band whose lengths sit at its lower edge.
  double idle_block_us = 0.3;
  /// A kernel's own span past its blocks' work: the first wave's dispatch and the last block's
  /// drain. To be measured by bench_attention's graph replay of a batch-1, 16-token V1 launch.
  double kernel_floor_us = 1.0;
  /// Between dependent kernel nodes of a graph (end of one to the first block of the next). To be
  /// measured by bench_attention: a V2 replay at 16 tokens minus two V1 replays' floors.
  double launch_gap_us = 0.6;
  /// A dependent L2 read under load (~600 cycles at 1.98 GHz): the unit of the merge's latency
  /// chain. To be measured by decode_loop: the merge's share of V2 at batch 1 (nsys, or V2 minus
  /// pass 1 alone).
  double l2_round_trip_us = 0.3;
  /// L2 read bandwidth for the merge's partials (written by pass 1 just before, so L2-resident
  /// while they fit l2_bytes). To be measured with the merge as above at batch 64.
  double l2_gbs = 7000;
  double l2_bytes = 50.0 * 1024 * 1024;
  /// The merge block's barriers, tree and stores. Same measurement as l2_round_trip_us.
  double merge_tree_us = 0.15;
  /// Registers per thread and static shared memory of MergePartitionsKernel (ptxas -v for sm_90,
  /// bench/results/static/after-fixed.json; Occupancy.ModelMatchesTheStaticReport checks them): its
  /// residency follows from them.
  int merge_registers = 80;
  int merge_smem_bytes = 1088;
  /// The merge before issue 19 (one serial chain of partitions per (sequence, head), ~4 loads per
  /// round trip): only for before/after predictions (bench/plan_report.cpp), never for planning.
  bool serial_merge = false;
};

/// The constants the planner uses.
inline constexpr CostConstants kCostConstants{};

/// What the model predicts for one attention call at one length (every sequence `len` tokens).
struct CostBreakdown {
  double us = 0;         // the whole call: pass1_us + merge_us + fixed_us
  double pass1_us = 0;   // pass 1 (or V1): its blocks' waves over the resident slots
  double merge_us = 0;   // V2 merge: its latency chain or its partials' bandwidth
  double fixed_us = 0;   // kernel floors and launch gaps
  double bytes = 0;      // bench's bytes model: K+V, q and out, V2 partials written and read
  double roof_share = 0; // bytes / (us x read_gbs)
};

/// The prediction for `plan`'s launch (kernel, partition_size, grid_x, batch) at length `len`,
/// for `resolved`'s spec and device model.
CostBreakdown predict_call(const ExecutorConfig& resolved, const BucketPlan& plan, int len,
                           const CostConstants& k = kCostConstants);

/// Pass 1's time alone (the wave model, exposed for tests): `rows` rows of `grid_x` blocks in launch
/// order, each row `full` blocks streaming full_bytes, then `tail` blocks streaming tail_bytes (0 or
/// 1), then idle ones; `slots` resident at once, each streaming at min(block_gbs, read_gbs /
/// streaming blocks) after a fixed block_fixed_us. Idle blocks cost idle_block_us of slot time each,
/// spread over the slots.
double simulate_waves(long long rows, int grid_x, int full, double full_bytes, int tail, double tail_bytes,
                      long long slots, const CostConstants& k = kCostConstants);

}  // namespace decodegraph::detail
