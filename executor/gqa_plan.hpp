// The V1/V2 (GQA) kernel family's planning (internal): what its launch of a bucket is, partitions,
// grids, workspace and the cost model's predictions (gqa_launch.cpp), and which launch each kernel
// policy picks for a bucket: the threshold rule, kAuto's least regret over its candidates, and the
// candidates kMeasured times (gqa_policy.cpp). Host-only, no backend.
#pragma once

#include <vector>

#include "decodegraph/executor.hpp"

namespace decodegraph::detail {

/// Pass-1 blocks per partition index: one per (sequence, KV head, head chunk), as the launcher maps
/// grid y (kernels::pass1_head_chunks: the chunks of q_len x group rows).
long long blocks_per_partition(const AttentionSpec& spec, int batch, int q_len = 1);

/// Resident pass-1 blocks of the kernel a q_len launches: the device model's (num_sms x
/// blocks_per_sm, which describes q_len 1's kernel) where q_len rows select the same kernel, else
/// num_sms x the occupancy model's blocks per SM of the kernel that runs (kernels/occupancy.cpp:
/// q_len 4 at GQA 2 runs on tensor cores, GQA 1 x q_len 8 with 8 warps).
long long pass1_slots(const ExecutorConfig& resolved, int q_len);

/// Sets the launch fields of `plan` (kernel, partitions, grids, workspace, launch_len and the block
/// counts) for `kernel` at `partition_size` (V2), and the cost model's predictions of that launch at
/// the band's lower edge, middle and upper edge (predicted_regret and candidates_scored reset to 0:
/// kAuto's choice sets them). Band fields and design_len must be set.
void set_launch(BucketPlan& plan, const ExecutorConfig& resolved, KernelKind kernel, int partition_size);

/// One of kAuto's candidates: its plan (launch and predictions set) and its worst-case regret over
/// the band's three lengths (its predicted time over the best candidate's at that length, minus 1).
struct ScoredPlan {
  BucketPlan plan;
  double regret = 0;
};

/// kAuto's candidates for a bucket (band fields and design_len set): V1 at or below the threshold,
/// V2 at the caller's fixed partition size or at kAuto's sizes (docs/planning.md), each scored. The
/// plan kAuto makes is the least regret (ties: the shorter predicted time at the upper edge, then
/// the earlier candidate).
std::vector<ScoredPlan> auto_candidates(const BucketPlan& bucket, const ExecutorConfig& resolved);

/// kMeasured's candidates for a bucket: V1 (at or below the threshold), then V2 at kAuto's best V2
/// partition size and at half and twice it where those are at least kAuto's shortest (64 tokens) and
/// still split the band's longest length; each with the model's predicted_us (num_layers calls, every
/// sequence at the band's middle).
std::vector<PlanCandidate> measure_candidates(const BucketPlan& plan, const ExecutorConfig& resolved);

/// The plan of one (q_len, batch bucket, band) under the config's policy: its band fields, then
/// kThreshold's rule (V1 up to the threshold, else V2 at the fill rule's partition size) or kAuto's
/// least regret, and under kMeasured the candidates to time (kAuto's choice until then). Graph ids
/// are make_plans'.
BucketPlan make_plan(const ExecutorConfig& resolved, int q_len, int batch, int band);

}  // namespace decodegraph::detail
