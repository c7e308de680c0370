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
  /// A pass-1 block's latency chain before it streams: the block table's read, then the first
  /// tile's DRAM round trip (~700 cycles each at 1.98 GHz, dependent; the q load overlaps them). Its
  /// instructions outside the main loop are counted apart (the issue model below). To be measured by
  /// decode_loop at batch 1 with P = block_size x 1 and x 2 (the difference isolates the fixed time;
  /// minus the issue term, this).
  double block_latency_us = 0.7;
  /// A block past its sequence's length: it reads the length and exits (one L2 round trip). To be
  /// measured by decode_loop over a band whose lengths sit at its lower edge.
  double idle_block_us = 0.3;
  /// A kernel's own span past its blocks' work: the first wave's dispatch and the last block's
  /// drain. To be measured by bench_attention's graph replay of a batch-1, 16-token V1 launch.
  double kernel_floor_us = 1.0;
  /// Between dependent kernel nodes of a graph (end of one to the first block of the next). To be
  /// measured by bench_attention: a V2 replay at 16 tokens minus two V1 replays' floors.
  double launch_gap_us = 0.6;
  /// The issue model of an SM (issue 31): 4 sub-partitions, each issuing at most one
  /// warp-instruction per cycle at the SM clock, at `issue_efficiency` of that (dependencies,
  /// scoreboard and bank stalls). The clock is the H200's boost clock (1.98 GHz); the efficiency is
  /// an assumption (0.8) until decode_loop measures an issue-bound launch (fp8 at batch 8 x 128K:
  /// KV bytes x the loop's instructions per byte / time / 132 SMs / the clock / 4).
  double sm_clock_ghz = 1.98;
  int sub_partitions = 4;
  double issue_efficiency = 0.8;
  /// Where >= 0, replaces the static report's figures for every pass-1 kernel (pass1_issue):
  /// warp-instructions of the main loop per K+V byte of a block, and per warp outside it. For tests
  /// on round numbers (0: no issue cap, no instruction time in the fixed phase); the planner uses
  /// the table (negative).
  double loop_instr_per_byte_override = -1;
  double outside_instr_override = -1;
  /// A dependent L2 read under load (~600 cycles at 1.98 GHz): the unit of the merge's latency
  /// chain. To be measured by decode_loop: the merge's share of V2 at batch 1 (nsys, or V2 minus
  /// pass 1 alone).
  double l2_round_trip_us = 0.3;
  /// L2 read bandwidth for the merge's partials (written by pass 1 just before, so L2-resident
  /// while they fit l2_bytes). To be measured with the merge as above at batch 64.
  double l2_gbs = 7000;
  double l2_bytes = 50.0 * 1024 * 1024;
  /// The merge block's straight-line warp-instructions on its dependent chain (maxima, weights,
  /// folds, the tree, the stores), issued at the SM's issue rate shared by the merge warps resident on
  /// a sub-partition. The static report's MergePartitionsKernel<bf16 / fp16>, prologue_instr +
  /// epilogue_instr = 471 + 295 (bench/results/static/after-fixed.json; issue 31 read ~940 before the
  /// cut; CostModel.InstructionTableMatchesTheStaticReport checks it); its fold loop's further rounds
  /// count as round trips only. To be measured with l2_round_trip_us (decode_loop: the merge's share
  /// of V2 at batch 1).
  double merge_chain_instr = 471 + 295;
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
/// Pass 1's time is split by what removing a term would save: fixed_us is pass 1 minus pass 1 with
/// no block fixed phase (and no idle blocks), loop_us the rest; issue_us (part of loop_us) is what
/// the issue cap adds to the loop (0 where it does not bind).
struct CostBreakdown {
  double us = 0;         // the whole call: pass1_us + merge_us + launch_us
  double pass1_us = 0;   // pass 1 (or V1): its blocks' waves over the resident slots (loop + fixed)
  double loop_us = 0;    // pass 1's streaming: the main loop at min(block, roof, issue) rates
  double fixed_us = 0;   // pass 1's block fixed phases (latency chain, prologue/epilogue issue), idle blocks
  double issue_us = 0;   // of loop_us: what the issue cap adds (0: not issue-bound)
  double merge_us = 0;   // V2 merge: its latency chain or its partials' bandwidth
  double launch_us = 0;  // kernel floors and launch gaps
  double bytes = 0;      // bench's bytes model: K+V, q and out, V2 partials written and read
  double roof_share = 0; // bytes / (us x read_gbs)
};

/// What the issue model charges one pass-1 kernel: per K+V byte of a block's main loop, and per
/// warp outside it (prologue + epilogue), from the static report's table (cost_model.cpp) or the
/// constants' overrides; the block's warps, and the SMs the blocks spread over.
struct Pass1Issue {
  double loop_instr_per_byte = 0;   // 0: no issue cap
  double outside_instr = 0;         // per warp; 0: the fixed phase is the latency chain alone
  int warps = 4;
  int num_sms = 1;
};

/// The issue figures of the pass-1 kernel `spec` at `q_len` launches (the static report's row of
/// its math, head size, layout and dtype; the soft-cap's path where the spec caps logits; the V2 or
/// V1 epilogue).
Pass1Issue pass1_issue(const AttentionSpec& spec, int q_len, int num_sms, bool v2, const CostConstants& k = kCostConstants);

/// The static report's figures for one pass-1 kernel family (tests check them against the JSON).
struct Pass1InstrRow {
  struct Layout {
    double per_byte = 0, per_byte_nocap = 0;           // main loop, per K+V byte at 4 warps
    double prologue = 0, epilogue_v2 = 0, epilogue_v1 = 0;  // per warp, outside the tiles
  };
  bool found = false;
  Layout vllm, nhd;
};
/// `tensor_cores`: TensorCoreMath; `fp8`: an fp8 cache (tensor cores, any q dtype).
Pass1InstrRow pass1_instr_row(DType q, bool fp8, bool tensor_cores, int head_size);

/// A block's fixed phase when `starting` blocks start together over `issue.num_sms` SMs, `slots`
/// resident: the latency chain plus the outside-loop instructions of the blocks that start together
/// on one sub-partition, at its issue rate.
double block_fixed_us(const Pass1Issue& issue, double starting, long long slots, const CostConstants& k = kCostConstants);

/// The prediction for `plan`'s launch (kernel, partition_size, grid_x, batch) at length `len`,
/// for `resolved`'s spec and device model.
CostBreakdown predict_call(const ExecutorConfig& resolved, const BucketPlan& plan, int len,
                           const CostConstants& k = kCostConstants);

/// Pass 1's time alone (the wave model, exposed for tests): `rows` rows of `grid_x` blocks in launch
/// order, each row `full` blocks streaming full_bytes, then `tail` blocks streaming tail_bytes (0 or
/// 1), then idle ones; `slots` resident at once, each streaming at min(block_gbs, read_gbs /
/// streaming, the issue cap) after its fixed phase (block_fixed_us of the blocks that start with it).
/// The issue cap: the SMs' issue rate / loop_instr_per_byte, shared by the streaming blocks (at most
/// num_sms of them get a whole SM). Idle blocks cost idle_block_us of slot time each, spread over the
/// slots. `issue` default: no instructions counted (the fixed phase is block_latency_us, no cap).
double simulate_waves(long long rows, int grid_x, int full, double full_bytes, int tail, double tail_bytes,
                      long long slots, const CostConstants& k = kCostConstants, const Pass1Issue& issue = {});

}  // namespace decodegraph::detail
