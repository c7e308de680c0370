// Planning (internal): the per-bucket plans and the launch identity that decides which buckets share
// a graph. Plans are made from a checked config (config_checks.hpp). Host-only, no backend.
#pragma once

#include <cstddef>
#include <tuple>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/config_checks.hpp"

namespace decodegraph::detail {

/// The lengths a layer group's plan of band (band_lo, band_hi] is made for: the three it is scored and
/// predicted at (lo = band_lo + 1, or for the first band half its upper edge; mid; hi), and the
/// design length its partitions are sized for (docs/planning.md). The threshold's "above it always
/// V2" applies to hi. The one place that maps a group's spec to shorter lengths: a sliding window W
/// reads min(L, W) tokens, so each length is capped at W. The launch itself (launch_len) still
/// covers the whole band; a windowed V2 launch's partitions (grid, workspace) cover what the window
/// reads, at most W + block_size - 1 tokens from the window's first block.
struct PlannedLengths {
  int lo = 0, mid = 0, hi = 0;
  int design = 0;
};
/// With q_len rows (a speculative step) a window reads W + q_len - 1 tokens: the cap is that.
PlannedLengths planned_lengths(const AttentionSpec& group_spec, int band_lo, int band_hi, int q_len = 1);

/// Plans for every (batch bucket, band) of one spec, `resolved.spec` with `resolved.device_model`
/// (layer_specs is not read: the plan book plans each layer group with its own planning config,
/// LayerGroups::planning_config), bucket-major: index = bucket * bands + band. Graph ids are
/// assigned (identical launches share one, numbered in bucket-major order of first use), except
/// under kMeasured, where they stay -1 until the bucket is measured.
std::vector<BucketPlan> make_plans(const ExecutorConfig& resolved);

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

/// What makes two launches identical: equal keys replay the same graph.
using LaunchKey = std::tuple<int, int, int, int, int, int, int, int, std::size_t>;
LaunchKey launch_key(const BucketPlan& plan);

}  // namespace decodegraph::detail
