// Planning (internal): configuration checks and the per-bucket plans. Host-only, no backend.
#pragma once

#include <vector>

#include "decodegraph/executor.hpp"

namespace decodegraph::detail {

/// The configuration with defaults filled in (band edges, batch buckets, max_blocks_per_seq,
/// num_sms). Throws Error naming the parameter, the value and what is allowed.
ExecutorConfig resolve_config(ExecutorConfig config, int device_sms);

/// Plans for every (batch bucket, band), bucket-major: index = bucket * bands + band.
std::vector<BucketPlan> make_plans(const ExecutorConfig& resolved);

}  // namespace decodegraph::detail
