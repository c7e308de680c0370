// kAuto's and kThreshold's plan side by side for each band of the run's batch bucket, and why they
// differ: the section that shows the V1 -> V2 swap.
#pragma once

#include <string>
#include <vector>

#include "json_out.hpp"

namespace dgloop {

/// kAuto's and kThreshold's plan for one band of the run's batch bucket, and why they differ.
struct PolicyRow {
  dg::BucketPlan automatic, threshold;
  std::string why;
};

/// Plans every bucket under both policies (on cfg's device model) and keeps the bands of `batch`.
std::vector<PolicyRow> compare_policies(dg::ExecutorConfig cfg, int batch);

/// The text section: title, table and the note on the swap.
std::string policies_report(const std::vector<PolicyRow>& rows, int batch, const dg::DeviceModel& model,
                            const std::string& policy, int threshold);
json policies_json(const std::vector<PolicyRow>& rows);

}  // namespace dgloop
