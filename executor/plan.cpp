// Planning: a layer group's plans for every (q_len, batch bucket, band), the lengths each plan is
// made for, and which plans share a graph (equal launch keys). Which launch each bucket gets is its
// kernel family's rule (gqa_policy.cpp for V1/V2). Everything shape-dependent is decided here, on the
// host, so that running a bucket only replays launches. docs/planning.md explains the rules.
#include "executor/plan.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/device_model.hpp"
#include "executor/gqa_plan.hpp"
#include "executor/layer_groups.hpp"
#include "executor/plan_book.hpp"
#include "kernels/decode_math.hpp"

namespace decodegraph {
namespace detail {

// The band's own lengths, or for a windowed layer (window W), which reads min(L, W) tokens, each
// of them capped at W: the threshold's "above it always V2" then applies to that length, so a
// 128-token window runs V1 in every band.
PlannedLengths planned_lengths(const AttentionSpec& spec, int band_lo, int band_hi, int q_len) {
  PlannedLengths r;
  // The lower edge is band_lo + 1 tokens. The first band's is 1 token, where every launch is its
  // kernels' floors (and which asks for no partitions at all); it starts at half its upper edge
  // instead, where its lengths double as every other default band's do, so that its longer half
  // (which sets the step's time) is what is scored and split.
  r.lo = band_lo > 0 ? band_lo + 1 : std::max(1, band_hi / 2);
  r.mid = r.lo + (band_hi - r.lo + 1) / 2;
  r.hi = band_hi;
  r.design = band_lo > 0 ? band_lo : std::max(1, band_hi / 2);
  // q_len rows read from their first row's window on: W + q_len - 1 tokens.
  if (spec.sliding_window > 0)
    for (int* len : {&r.lo, &r.mid, &r.hi, &r.design}) *len = std::min(*len, math::read_window(spec.sliding_window, q_len));
  return r;
}

std::array<int, 3> band_lengths(const ExecutorConfig& c, const BucketPlan& p) {
  const PlannedLengths l = planned_lengths(c.spec, p.band_lo, p.band_hi, p.q_len);
  return {l.lo, l.mid, l.hi};
}

int planned_hi(const ExecutorConfig& c, const BucketPlan& p) {
  return planned_lengths(c.spec, p.band_lo, p.band_hi, p.q_len).hi;
}

LaunchKey launch_key(const BucketPlan& p) {
  return {static_cast<int>(p.kernel), p.batch,  p.q_len,  p.launch_len, p.partition_size,
          p.max_partitions,           p.grid_x, p.grid_y, p.workspace_bytes};
}

std::vector<BucketPlan> make_plans(const ExecutorConfig& c) {
  std::vector<BucketPlan> plans;
  plans.reserve(c.q_lens.size() * c.batch_buckets.size() * c.band_edges.size());
  for (const int q_len : c.q_lens)
    for (const int batch : c.batch_buckets)
      for (int band = 0; band < static_cast<int>(c.band_edges.size()); ++band)
        plans.push_back(make_plan(c, q_len, batch, band));
  if (c.policy != KernelPolicy::kMeasured) {
    std::map<LaunchKey, int> ids;
    for (BucketPlan& p : plans) p.graph_id = ids.emplace(launch_key(p), static_cast<int>(ids.size())).first->second;
  }
  return plans;
}

}  // namespace detail

std::vector<BucketPlan> plan_buckets(const ExecutorConfig& config) {
  ExecutorConfig c = detail::resolve_planning(config);
  c.device_model = detail::fill_device_model(c.device_model, detail::layer_spec(c, 0), host_device_model, "");
  return detail::PlanBook(c, detail::LayerGroups(c, config.device_model, host_device_model)).plans();
}

}  // namespace decodegraph
