#include "plan_only.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

#include "capture_compare.hpp"
#include "json_out.hpp"

namespace dgloop {

namespace {

/// Each layer group's layers (dg::layer_groups_of), for the output.
std::vector<std::vector<int>> group_layers(const dg::ExecutorConfig& cfg) {
  std::vector<std::vector<int>> out;
  const std::vector<int> group_of = dg::layer_groups_of(cfg);
  for (int l = 0; l < static_cast<int>(group_of.size()); ++l) {
    if (group_of[l] >= static_cast<int>(out.size())) out.resize(group_of[l] + 1);
    out[group_of[l]].push_back(l);
  }
  return out;
}

int distinct_graphs(const std::vector<dg::BucketPlan>& plans) {
  std::set<int> ids;
  for (const dg::BucketPlan& p : plans) ids.insert(p.graph_id);
  return static_cast<int>(ids.size());
}

void print_plans(const Setup& s, const dg::ExecutorConfig& cfg, const std::string& source,
                 const std::vector<dg::BucketPlan>& plans, std::FILE* out) {
  const dg::AttentionSpec& spec = cfg.spec;
  fmt::print(out, "decodegraph {} decode_loop --plan-only\n", dg::version());
  std::vector<std::string> planning_defaults;  // only the options planning reads
  for (const std::string& d : s.defaults_used)
    for (const char* flag : {"--preset ", "--batch ", "--max-seq-len ", "--partition ", "--threshold ", "--policy "})
      if (d.rfind(flag, 0) == 0) planning_defaults.push_back(d);
  if (!planning_defaults.empty()) fmt::print(out, "defaults used: {};\n", fmt::join(planning_defaults, "; "));
  fmt::print(out, "shape: {} q heads, {} kv heads, head {}, block {}, {}, kv {}; max_batch {}, max_seq_len {}, "
                  "threshold {}\n",
             spec.num_q_heads, spec.num_kv_heads, spec.head_size, spec.block_size, dg::to_string(spec.dtype),
             dg::to_string(spec.kv_dtype), cfg.max_batch, cfg.max_seq_len, cfg.v2_threshold);
  fmt::print(out, "policy {}; device model {} SMs x {} resident pass-1 blocks = {} slots ({})\n", s.opt.policy,
             cfg.device_model.num_sms, cfg.device_model.blocks_per_sm, cfg.device_model.target_blocks(), source);
  if (!cfg.layer_specs.empty()) {  // each layer group is planned with its own spec and kernel's slots
    const std::vector<std::vector<int>> groups = group_layers(cfg);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const dg::AttentionSpec& gs = cfg.layer_specs[static_cast<std::size_t>(groups[g].front())];
      fmt::print(out, "layer group {}: layers {}: {} q heads, {} kv heads, head {}, scale {:.6g}\n", g,
                 fmt::join(groups[g], ","), gs.num_q_heads, gs.num_kv_heads, gs.head_size, gs.effective_scale());
    }
  }
  const std::size_t num_q = cfg.q_lens.size();
  if (num_q > 1 || cfg.q_lens.front() > 1)
    fmt::print(out, "q_lens {}: every (batch bucket, band) planned for each n, the table's n column (n query "
                    "tokens per sequence: the last verified one and n - 1 drafts)\n",
               fmt::join(cfg.q_lens, ","));
  const bool measured = cfg.policy == dg::KernelPolicy::kMeasured;
  // The graph column is the launch id: a graph under kHost, a SWITCH branch's launches under kDevice.
  std::set<int> batches;
  for (const dg::BucketPlan& p : plans) batches.insert(p.batch);
  const std::string graphs = cfg.band_select == dg::BandSelect::kHost
                                 ? std::string(", one graph each (band select host)")
                                 : num_q > 1 ? fmt::format(", in {} graphs, one per (n, batch bucket) (band select device)",
                                                           batches.size() * num_q)
                                             : fmt::format(", in {} graphs, one per batch bucket (band select device)",
                                                           batches.size());
  fmt::print(out, "{} buckets, {} distinct launches{}{}:\n{}", plans.size(),
             measured ? std::string("(decided when measured)") : std::to_string(distinct_graphs(plans)),
             measured ? "" : graphs, measured ? "; kMeasured starts from kAuto's choice" : "",
             dg::format_plan_table(plans));
}

json plans_document(const Setup& s, const dg::ExecutorConfig& cfg, const std::string& source,
                    const std::vector<dg::BucketPlan>& plans, const std::vector<CaptureCost>& costs) {
  const dg::AttentionSpec& spec = cfg.spec;
  json j;
  if (!costs.empty()) j["capture_compare"] = plan_only_capture_json(costs, s.opt.layers);
  j["program"] = "decode_loop";
  j["version"] = dg::version();
  j["mode"] = "plan-only";
  j["config"] = shape_json(s.opt.preset, spec);
  j["config"].update({{"max_batch", cfg.max_batch},
                      {"q_lens", cfg.q_lens},
                      {"max_seq_len", cfg.max_seq_len},
                      {"threshold", cfg.v2_threshold},
                      {"partition", s.opt.partition}});
  j["policy"] = s.opt.policy;
  j["device_model"] = device_model_json(cfg.device_model, source);
  json groups = json::array();  // plans[].group indexes these; one group unless the layers differ
  const std::vector<std::vector<int>> layers = group_layers(cfg);
  for (std::size_t g = 0; g < layers.size(); ++g) {
    const dg::AttentionSpec& gs = cfg.layer_specs.empty() ? cfg.spec : cfg.layer_specs[layers[g].front()];
    json one = shape_json(s.opt.preset, gs);
    one.erase("preset");
    one.update({{"group", g}, {"layers", layers[g]}, {"scale", gs.effective_scale()}});
    groups.push_back(one);
  }
  j["layer_groups"] = groups;
  j["buckets"] = plans.size();
  j["distinct_graphs"] = cfg.policy == dg::KernelPolicy::kMeasured ? json(nullptr) : json(distinct_graphs(plans));
  j["plans"] = plans_json(plans);
  return j;
}

}  // namespace

int plan_only(const Setup& s, std::FILE* out) {
  // The host model fills in what --device-model leaves out: for the output here (layer group 0's),
  // and in plan_buckets for each layer group's own kernel.
  dg::ExecutorConfig cfg = s.cfg;
  const dg::DeviceModel host = dg::host_device_model(cfg.spec);
  if (cfg.device_model.num_sms == 0) cfg.device_model.num_sms = host.num_sms;
  if (cfg.device_model.blocks_per_sm == 0) cfg.device_model.blocks_per_sm = host.blocks_per_sm;
  const std::string source = model_source(s.opt.device_model, /*gpu=*/false);
  const std::vector<dg::BucketPlan> plans = dg::plan_buckets(s.cfg);
  print_plans(s, cfg, source, plans, out);
  std::vector<CaptureCost> costs;
  if (s.opt.capture_compare) {
    costs = plan_only_capture_costs(s.cfg, s.opt.layers);
    fmt::print(out, "{}", plan_only_capture_report(costs, s.opt.layers));
  }
  if (!s.opt.json_path.empty()) {
    write_json(s.opt.json_path, plans_document(s, cfg, source, plans, costs));
    fmt::print(out, "json: {}\n", s.opt.json_path);
  }
  return 0;
}

}  // namespace dgloop
