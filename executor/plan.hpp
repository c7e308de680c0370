// Planning (internal): the plans of every (q_len, batch bucket, band) of a layer group, the lengths
// each plan is made for, and the launch identity that decides which buckets share a graph
// (plan.cpp). Which launch a bucket gets is its kernel family's: gqa_plan.hpp for the V1/V2 kernels.
// Plans are made from a checked config (config_checks.hpp). Host-only, no backend.
#pragma once

#include <array>
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

/// The lengths a plan is scored at (kAuto) and predicted for: its group's planned lengths.
std::array<int, 3> band_lengths(const ExecutorConfig& resolved, const BucketPlan& plan);

/// The longest length a plan of this bucket is chosen for: where the threshold applies.
int planned_hi(const ExecutorConfig& resolved, const BucketPlan& plan);

/// Plans for every (batch bucket, band) of one spec, `resolved.spec` with `resolved.device_model`
/// (layer_specs is not read: the plan book plans each layer group with its own planning config,
/// LayerGroups::planning_config), bucket-major: index = bucket * bands + band. Graph ids are
/// assigned (identical launches share one, numbered in bucket-major order of first use), except
/// under kMeasured, where they stay -1 until the bucket is measured.
std::vector<BucketPlan> make_plans(const ExecutorConfig& resolved);

/// What makes two launches identical: equal keys replay the same graph.
using LaunchKey = std::tuple<int, int, int, int, int, int, int, int, std::size_t>;
LaunchKey launch_key(const BucketPlan& plan);

}  // namespace decodegraph::detail
