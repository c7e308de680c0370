#include "report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace dgloop {

std::string machine_report(const Machine& m, bool gpu) {
  if (gpu)
    return fmt::format("backend: cuda on {} ({} SMs); timings are GPU wall-clock per step (host launch + device)\n",
                       m.name, m.sms) +
           fmt::format("measured read bandwidth: {:.0f} GB/s (median of {} streaming reads of {}; best {:.0f} GB/s)\n",
                       m.read.median_gbs, m.read.iterations,
                       dgbench::format_bytes(static_cast<double>(m.read.buffer_bytes)), m.read.best_gbs) +
           fmt::format("measured d2d copy bandwidth: {:.0f} GB/s read + write (median of {} copies of {})\n",
                       m.copy.median_gbs, m.copy.iterations,
                       dgbench::format_bytes(static_cast<double>(m.copy.buffer_bytes)));
  return fmt::format(
      "backend: host ({}). All timings are CPU timings of the host backend, NOT GPU timings;\n"
      "GB/s against device bandwidth is not applicable (n/a). Graph replay and eager run the\n"
      "same host implementation here, so expect a speedup near 1.0x.\n",
      dg::cuda_device_available() ? "chosen with --backend host" : "no CUDA device present");
}

std::string run_header(const Setup& s) {
  const dg::AttentionSpec& spec = s.spec;
  std::string h;
  if (!s.defaults_used.empty()) {
    h += "defaults used:";
    for (const auto& d : s.defaults_used) h += fmt::format(" {};", d);
    h += "\n";
  }
  h += fmt::format("shape: {} q heads, {} kv heads, head {}, block {}, {}, kv {}, layout {}; batch {}, {} layers, {} "
                   "steps x {} segments\n",
                   spec.num_q_heads, spec.num_kv_heads, spec.head_size, spec.block_size, dg::to_string(spec.dtype),
                   dg::to_string(spec.kv_dtype), dg::to_string(spec.layout), s.opt.batch, s.opt.layers, s.opt.steps,
                   s.segments.size());
  if (s.opt.q_lens.size() > 1 || s.opt.q_lens.front() > 1)
    h += verify_loop_line(s.opt.q_lens);
  if (!s.cfg.layer_specs.empty()) {
    const std::vector<int> groups = dg::layer_groups_of(s.cfg);
    h += fmt::format("layers differ: {} layer groups, each planned on its own (the plan table's group column)\n",
                     *std::max_element(groups.begin(), groups.end()) + 1);
  }
  h += fmt::format("KV cache: {} blocks x {} layers = {}{}\n\n", s.geo.num_blocks, s.opt.layers,
                   dgbench::format_bytes(2.0 * static_cast<double>(s.geo.cache_bytes_all)),
                   spec.fp8_kv() ? " (fp8 codes, scales 1/256)" : "");
  return h;
}

std::string executor_report(const Setup& s, const dg::Executor& ex) {
  const dg::DeviceModel model = ex.config().device_model;
  std::string r = fmt::format("policy {}; device model {} SMs x {} resident pass-1 blocks = {} slots ({})\n",
                              s.opt.policy, model.num_sms, model.blocks_per_sm, model.target_blocks(), s.model_from);
  r += fmt::format("band select: {}{}\n", dg::to_string(ex.band_select()),
                   ex.band_select() == dg::BandSelect::kDevice
                       ? ex.config().q_lens.size() > 1
                             ? " (one graph per (n, batch bucket); the band is chosen in the graph, a SWITCH node per "
                               "layer)"
                             : " (one graph per batch bucket; the band is chosen in the graph, a SWITCH node per layer)"
                       : (ex.stats().band_select_note.empty() ? " (one graph per distinct plan)"
                                                              : " (" + ex.stats().band_select_note + ")"));
  r += fmt::format("plan (every bucket; this run uses batch bucket {}; {} distinct graphs for {} buckets{}):\n{}\n",
                   s.opt.batch, ex.stats().distinct_graphs, ex.plans().size(),
                   s.cfg.policy == dg::KernelPolicy::kMeasured
                       ? ", kMeasured: decided when each bucket is first captured"
                       : "",
                   ex.plan_table());
  return r;
}

namespace {

std::string graphs_table(const dg::ExecutorStats& stats) {
  // An n column only where some graph has q_len > 1: a plain loop's table is unchanged.
  const bool n_column =
      std::any_of(stats.graphs.begin(), stats.graphs.end(), [](const dg::GraphStats& g) { return g.q_len > 1; });
  std::vector<std::vector<std::string>> t = {{"graph", "bucket", "lengths", "buckets", "kernel", "captures",
                                              "replays", "nodes", "capture ms", "instantiate ms", "measure ms"}};
  if (n_column) t[0].insert(t[0].begin() + 2, "n");
  for (const auto& g : stats.graphs) {
    t.push_back({std::to_string(g.graph_id), std::to_string(g.batch), band_label(g.band_lo, g.band_hi),
                 std::to_string(g.buckets),
                 g.switch_graph                    ? fmt::format("switch, {} branches", g.branches)
                 : g.kernel == dg::KernelKind::kV2 ? fmt::format("v2 P={}", g.partition_size)
                                                   : "v1",
                 std::to_string(g.captures), std::to_string(g.replays), std::to_string(g.nodes),
                 fmt::format("{:.2f}", g.capture_ms), fmt::format("{:.2f}", g.instantiate_ms),
                 fmt::format("{:.2f}", g.measure_ms)});
    if (n_column) t.back().insert(t.back().begin() + 2, std::to_string(g.q_len));
  }
  return dgbench::format_table(t);
}

}  // namespace

std::string captures_report(const Setup& s, const dg::ExecutorStats& stats, const dg::MemoryReport& mem,
                            double capture_wall_ms) {
  std::string r = fmt::format(
      "\ncaptures: {} graphs captured of {} distinct for {} buckets; capture {:.2f} ms + instantiate {:.2f} "
      "ms in total ({:.2f} ms wall in the capturing steps)\n",
      stats.total_captures, stats.distinct_graphs, stats.buckets, stats.capture_ms, stats.instantiate_ms,
      capture_wall_ms);
  if (s.cfg.policy == dg::KernelPolicy::kMeasured)
    r += fmt::format("measuring (kMeasured): {} buckets, {} candidate graphs timed, {:.2f} ms\n",
                     stats.measured_buckets, stats.candidate_graphs, stats.measure_ms);
  r += graphs_table(stats);
  auto bytes = [](std::size_t b) { return dgbench::format_bytes(static_cast<double>(b)); };
  r += fmt::format("memory: static buffers {}, V2 workspace {}, graphs {}, total {}{}\n", bytes(mem.static_buffers),
                   bytes(mem.workspace), bytes(mem.graphs), bytes(mem.total()),
                   s.gpu ? "" : " (host memory; graphs: n/a on host)");
  r += fmt::format("steps: {} replayed ({} V1, {} V2), {} rejected\n", stats.steps, stats.replays(dg::KernelKind::kV1),
                   stats.replays(dg::KernelKind::kV2), stats.rejected_steps);
  return r;
}

// ---------------------------------------------------------------- JSON

namespace {

json config_json(const Setup& s) {
  const Options& o = s.opt;
  json j = shape_json(o.preset, s.spec);
  j.update({{"layout", dg::to_string(s.spec.layout)},
            {"batch", o.batch},
            {"layers", o.layers},
            {"steps", o.steps},
            {"q_lens", o.q_lens},
            {"start_lens", o.start_lens},
            {"max_seq_len", o.max_seq_len},
            {"threshold", o.threshold},
            {"partition", o.partition},
            {"policy", o.policy},
            {"device_model", o.device_model},
            {"capture", o.capture},
            {"seed", o.seed}});
  return j;
}

json captures_json(const dg::ExecutorStats& stats) {
  json jg = json::array();
  for (const auto& g : stats.graphs)
    jg.push_back({{"graph_id", g.graph_id},
                  {"batch", g.batch},
                  {"q_len", g.q_len},
                  {"band", g.band},
                  {"last_band", g.last_band},
                  {"band_lo", g.band_lo},
                  {"band_hi", g.band_hi},
                  {"buckets", g.buckets},
                  {"kernel", dg::to_string(g.kernel)},
                  {"partition_size", g.partition_size},
                  {"captures", g.captures},
                  {"replays", g.replays},
                  {"nodes", g.nodes},
                  {"capture_ms", g.capture_ms},
                  {"instantiate_ms", g.instantiate_ms},
                  {"measure_ms", g.measure_ms}});
  return {{"total", stats.total_captures},
          {"buckets", stats.buckets},
          {"distinct_graphs", stats.distinct_graphs},
          {"capture_ms", stats.capture_ms},
          {"instantiate_ms", stats.instantiate_ms},
          {"measure_ms", stats.measure_ms},
          {"measured_buckets", stats.measured_buckets},
          {"candidate_graphs", stats.candidate_graphs},
          {"graphs", jg}};
}

json check_json(const Setup& s, const LoopResults& loop, const StepTotals& totals) {
  return {{"enabled", s.opt.check},
          {"mismatch_steps", loop.check.mismatch_steps},
          {"bitwise_equal_steps", totals.bitwise_steps},
          {"max_abs_diff", num_or_null(totals.max_diff)},
          {"reference_checks", loop.check.ref_checks},
          {"reference_max_err", num_or_null(loop.check.ref_max_err)},
          {"append_checks", loop.check.append_checks},  // host backend: token x layer appends looked up
          {"append_failure", loop.check.append_failure}};
}

json steps_json(const std::vector<StepRecord>& recs) {
  json js = json::array();
  for (const auto& r : recs)
    js.push_back({{"segment", r.segment},
                  {"step", r.step},
                  {"band", r.band},
                  {"kernel", dg::to_string(r.kernel)},
                  {"partition_size", r.partition_size},
                  {"captured", r.captured},
                  {"measured", r.measured},
                  {"graph_id", r.graph_id},
                  {"q_len", r.q_len},
                  {"tokens", r.tokens},
                  {"max_len", r.max_len},
                  {"bytes", num_or_null(r.bytes)},
                  {"kv_bytes", num_or_null(r.kv_bytes)},
                  {"eager_us", num_or_null(r.eager_us)},
                  {"graph_us", num_or_null(r.graph_us)}});
  return js;
}

}  // namespace

json run_json(const RunReport& r) {
  const Setup& s = r.s;
  json j;
  j["program"] = "decode_loop";
  j["version"] = dg::version();
  j["backend"] = dg::to_string(s.backend);
  j["device"] = r.machine.name;
  j["timing"] = s.gpu ? "gpu-wallclock" : "cpu-host-backend";
  j["read_bandwidth_gbs"] = num_or_null(r.machine.read.median_gbs, s.gpu);
  j["copy_bandwidth_gbs"] = num_or_null(r.machine.copy.median_gbs, s.gpu);
  j["config"] = config_json(s);
  j["defaults_used"] = s.defaults_used;
  j["policy"] = s.opt.policy;
  j["device_model"] = device_model_json(r.ex.config().device_model, s.model_from);
  j["plans"] = plans_json(r.ex.plans());
  j["policies"] = policies_json(r.policies);
  j["bands"] = bands_json(r.bands);
  j["kv_per_token"] = verify_json(r.verify);
  j["captures"] = captures_json(r.stats);
  j["capture_compare"] = run_capture_json(r.costs);
  j["band_select"] = dg::to_string(r.ex.band_select());
  j["memory"] = {{"static_buffers", r.mem.static_buffers},
                 {"workspace", r.mem.workspace},
                 {"graphs", r.mem.graphs},
                 {"total", r.mem.total()}};
  j["check"] = check_json(s, r.loop, r.totals);
  j["wall_s"] = r.loop.run_s;
  j["steps"] = steps_json(r.loop.recs);
  return j;
}

}  // namespace dgloop
