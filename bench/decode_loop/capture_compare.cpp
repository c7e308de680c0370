#include "capture_compare.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "backend.hpp"
#include "bench_common.hpp"
#include "options.hpp"

namespace dgloop {

namespace {

CaptureCost capture_cost(dg::ExecutorConfig cfg, dg::BandSelect mode) {
  cfg.band_select = mode;
  cfg.capture = dg::CapturePolicy::kUpFront;
  dg::Executor ex(cfg);
  const dg::ExecutorStats st = ex.stats();
  CaptureCost c;
  c.mode = dg::to_string(ex.band_select());
  c.graphs = st.total_captures;
  c.buckets = st.buckets;
  c.distinct_plans = st.distinct_plans;
  for (const dg::GraphStats& g : st.graphs) c.nodes += g.nodes;
  c.capture_ms = st.capture_ms;
  c.instantiate_ms = st.instantiate_ms;
  c.graph_bytes = ex.memory().graphs;
  c.note = st.band_select_note;
  c.q_lens = static_cast<int>(cfg.q_lens.size());
  return c;
}

/// Header and one row per band choice; the run adds a graph-memory column.
std::vector<std::vector<std::string>> cost_table(const std::vector<CaptureCost>& costs) {
  std::vector<std::vector<std::string>> t = {
      {"band select", "graphs", "buckets", "distinct plans", "nodes", "capture ms", "instantiate ms"}};
  for (const CaptureCost& c : costs)
    t.push_back({c.mode, std::to_string(c.graphs), std::to_string(c.buckets), std::to_string(c.distinct_plans),
                 std::to_string(c.nodes), fmt::format("{:.2f}", c.capture_ms),
                 fmt::format("{:.2f}", c.instantiate_ms)});
  return t;
}

/// The fields both forms write; each adds its own after them.
json cost_json(const CaptureCost& c) {
  return {{"band_select", c.mode},
          {"graphs", c.graphs},
          {"buckets", c.buckets},
          {"distinct_plans", c.distinct_plans},
          {"nodes", c.nodes},
          {"capture_ms", c.capture_ms},
          {"instantiate_ms", c.instantiate_ms}};
}

}  // namespace

std::vector<CaptureCost> capture_costs(const dg::ExecutorConfig& cfg) {
  std::vector<CaptureCost> costs;
  for (const dg::BandSelect mode : {dg::BandSelect::kHost, dg::BandSelect::kDevice})
    costs.push_back(capture_cost(cfg, mode));
  return costs;
}

std::string run_capture_report(const std::vector<CaptureCost>& costs, bool gpu) {
  if (costs.empty())
    return "\ncapture cost side by side: not computed under --policy measured (it would time every candidate "
           "of every bucket first)\n";
  std::vector<std::vector<std::string>> t = cost_table(costs);
  t[0].push_back("graph memory");
  for (std::size_t i = 0; i < costs.size(); ++i)
    t[i + 1].push_back(gpu ? dgbench::format_bytes(static_cast<double>(costs[i].graph_bytes)) : "n/a (host)");
  return fmt::format("\ncapture cost, every bucket captured up front (kHost: one graph per distinct plan; kDevice: one "
                     "per {}){}:\n{}",
                     costs.front().q_lens > 1 ? "(n, batch bucket)" : "batch bucket", costs.back().mode == "device" ? "" : " (kDevice fell back: " + costs.back().note + ")",
                     dgbench::format_table(t));
}

json run_capture_json(const std::vector<CaptureCost>& costs) {
  json a = json::array();
  for (const CaptureCost& c : costs) {
    json j = cost_json(c);
    j["graph_bytes"] = c.graph_bytes;
    j["note"] = c.note;
    a.push_back(std::move(j));
  }
  return a;
}

std::vector<CaptureCost> plan_only_capture_costs(const dg::ExecutorConfig& cfg, int layers) {
  if (cfg.policy == dg::KernelPolicy::kMeasured) usage_error("--capture-compare needs --policy auto or threshold");
  dg::ExecutorConfig ec = cfg;
  ec.backend = dg::BackendKind::kHost;
  ec.num_blocks = 1;
  ec.num_layers = layers;
  std::size_t block_bytes = 0;  // one block of the largest layer's cache
  int scale_count = 1;
  for (int l = 0; l < layers; ++l) {
    const dg::AttentionSpec& s = cfg.layer_specs.empty() ? cfg.spec : cfg.layer_specs[static_cast<std::size_t>(l)];
    block_bytes = std::max(block_bytes, s.block_bytes());
    scale_count = std::max(scale_count, s.kv_scale_count());
  }
  const std::vector<float> scales(static_cast<std::size_t>(scale_count), 1.0f);  // fp8: required
  std::vector<Buffer> caches;
  caches.reserve(2 * static_cast<std::size_t>(layers));  // the executor holds their addresses: never moved
  for (int l = 0; l < 2 * layers; ++l) caches.emplace_back(false, block_bytes);
  for (int l = 0; l < layers; ++l) {
    dg::LayerBuffers lb{caches[2 * l].get(), caches[2 * l + 1].get()};
    lb.k_cache_bytes = lb.v_cache_bytes = block_bytes;  // the host backend cannot ask
    const dg::AttentionSpec& s = cfg.layer_specs.empty() ? cfg.spec : cfg.layer_specs[static_cast<std::size_t>(l)];
    if (s.fp8_kv()) lb.k_scale = lb.v_scale = scales.data();
    ec.layers.push_back(lb);
  }
  return capture_costs(ec);
}

std::string plan_only_capture_report(const std::vector<CaptureCost>& costs, int layers) {
  return fmt::format("\ncapture cost, every bucket captured up front, {} layers, host backend (CPU times of recording "
                     "closures, not CUDA capture times; graph memory n/a on host):\n{}",
                     layers, dgbench::format_table(cost_table(costs)));
}

json plan_only_capture_json(const std::vector<CaptureCost>& costs, int layers) {
  json a = json::array();
  for (const CaptureCost& c : costs) {
    json j = cost_json(c);
    j["layers"] = layers;
    j["backend"] = "host";
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace dgloop
