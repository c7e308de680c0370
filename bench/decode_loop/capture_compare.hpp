// What capturing every bucket up front costs under each band choice (kHost: one graph per distinct
// plan; kDevice: one SWITCH graph per batch bucket), each by an executor of its own: at the end of a
// run on the run's caches, and under --plan-only --capture-compare on the host backend.
#pragma once

#include <string>
#include <vector>

#include "json_out.hpp"

namespace dgloop {

/// What capturing every bucket up front costs under one band choice (a separate executor).
struct CaptureCost {
  std::string mode;  // the band choice in effect ("host", or "device")
  int graphs = 0, buckets = 0, distinct_plans = 0;
  long long nodes = 0;
  double capture_ms = 0, instantiate_ms = 0;
  std::size_t graph_bytes = 0;
  std::string note;  // why kDevice fell back, if it did
  int q_lens = 1;    // how many q_lens the executor captured for
};

/// kHost, then kDevice, each with every bucket captured up front, on cfg's caches and backend.
std::vector<CaptureCost> capture_costs(const dg::ExecutorConfig& cfg);

/// The run's section: the two side by side (with graph memory on CUDA), or why they were not
/// computed (`costs` empty: kMeasured would time every candidate of every bucket first).
std::string run_capture_report(const std::vector<CaptureCost>& costs, bool gpu);
json run_capture_json(const std::vector<CaptureCost>& costs);

/// --plan-only --capture-compare: the same on the host backend, `layers` layers, each with a
/// one-block cache (capture does not read the caches). A usage error under kMeasured.
std::vector<CaptureCost> plan_only_capture_costs(const dg::ExecutorConfig& cfg, int layers);
std::string plan_only_capture_report(const std::vector<CaptureCost>& costs, int layers);
json plan_only_capture_json(const std::vector<CaptureCost>& costs, int layers);

}  // namespace dgloop
