// The decode loop itself: the caches, then segment by segment, step by step, every sequence grows by
// one token (a verify loop: brings n, keeps 1..n), the step replays through the Executor and runs again eagerly on the same inputs, both
// timed, and the outputs are checked against each other (and against the float64 reference on the
// host backend).
#pragma once

#include <vector>

#include "backend.hpp"
#include "bands.hpp"
#include "check.hpp"
#include "setup.hpp"

namespace dgloop {

/// Every layer's K and V caches (random, never zero), the eager launches' outputs, and for fp8
/// caches each layer's scales (dgbench::kFillKvScale, in the backend's memory).
struct Caches {
  explicit Caches(const Setup& s);
  std::vector<Buffer> k, v, eager_out, k_scale, v_scale, sinks;
  const float* k_scale_of(int l) const { return k_scale.empty() ? nullptr : static_cast<const float*>(k_scale[l].get()); }
  const float* v_scale_of(int l) const { return v_scale.empty() ? nullptr : static_cast<const float*>(v_scale[l].get()); }
  /// The preset's attention sinks ([num_q_heads] fp32 per layer), or null.
  const float* sinks_of(int l) const { return sinks.empty() ? nullptr : static_cast<const float*>(sinks[l].get()); }
};

/// The run's executor config: planning's (Setup::cfg) plus the caches and layers, the capture policy,
/// the backend and the KV append.
dg::ExecutorConfig run_config(const Setup& s, const Caches& caches);

/// What the loop produced.
struct LoopResults {
  std::vector<StepRecord> recs;
  CheckSummary check;
  double capture_wall_ms = 0;  // wall time of the steps that captured (or measured) a graph
  double run_s = 0;            // wall time of the whole loop
};

/// Runs every segment of `s` through `ex` (built from run_config(s, caches)).
LoopResults run_loop(const Setup& s, dg::Executor& ex, Caches& caches);

}  // namespace dgloop
