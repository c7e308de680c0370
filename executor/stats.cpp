// Statistics and the memory report, assembled in one place from the executor's parts.
#include "decodegraph/executor.hpp"
#include "executor/device_guard.hpp"
#include "executor/executor_impl.hpp"

namespace decodegraph {

long long ExecutorStats::replays(KernelKind kind, int group) const {
  const auto gi = static_cast<std::size_t>(group);
  long long n = 0;
  for (const GraphStats& g : graphs) {
    if (!g.switch_graph) {
      const KernelKind k = gi < g.group_kernels.size() ? g.group_kernels[gi] : g.kernel;
      if (k == kind) n += g.replays;
      continue;
    }
    const std::vector<KernelKind>& kernels = gi < g.group_band_kernels.size() ? g.group_band_kernels[gi] : g.band_kernels;
    for (std::size_t b = 0; b < g.band_replays.size() && b < kernels.size(); ++b)
      if (kernels[b] == kind) n += g.band_replays[b];
  }
  return n;
}

ExecutorStats Executor::stats() const {
  const Impl& m = *impl_;
  detail::DeviceScope device{*m.backend};
  ExecutorStats s;
  m.graphs->add_stats(s);  // graphs, capture and instantiate times, distinct_graphs
  for (GraphStats& g : s.graphs) {  // a bucket graph's branches, by launch id (BucketPlan::graph_id)
    if (!g.switch_graph) continue;
    for (int band = 0; band < m.plans->num_bands(); ++band)
      g.band_launch_ids.push_back(m.plans->plan(g.graph_id, band).graph_id);
  }
  s.band_select = m.band_mode;
  s.band_select_note = m.band_note;
  s.programmatic_launch = m.programmatic;
  s.programmatic_launch_note = m.programmatic_note;
  s.buckets = static_cast<int>(m.plans->num_cells());  // not plans().size(): that counts each layer group's
  s.distinct_plans = static_cast<int>(m.plans->launches().size());
  for (const BucketPlan& p : m.plans->group_plans(0)) s.undecided_buckets += p.graph_id < 0;  // the same in every group
  s.steps = m.steps;
  s.rejected_steps = m.rejected;
  s.total_captures = m.graphs->total_captures();
  s.measure_ms = m.measurer->measure_ms();
  s.measured_buckets = m.measurer->measured_buckets();
  s.candidate_graphs = m.measurer->candidate_graphs();
  s.rebinds = m.rebinds;
  s.graph_updates = m.graph_updates;
  s.graph_reinstantiations = m.graph_reinstantiations;
  s.input_downloads = m.staging->input_downloads();
  s.staging_copy_bytes = m.staging->copy_bytes();
  s.bad_block_reports = m.bad_blocks->reports();
  s.caller_captures = m.graphs->caller_captures();
  return s;
}

MemoryReport Executor::memory() const {
  const Impl& m = *impl_;
  detail::DeviceScope device{*m.backend};
  MemoryReport r;
  r.static_buffers = m.ledger.static_bytes;
  r.workspace = m.ledger.workspace_bytes;
  r.graphs = m.graphs->bytes();
  return r;
}

}  // namespace decodegraph
