#include "json_out.hpp"

#include <cmath>
#include <fstream>

#include "options.hpp"

namespace dgloop {

json num_or_null(double v, bool present) { return present && std::isfinite(v) ? json(v) : json(nullptr); }

json plan_json(const dg::BucketPlan& p) {
  json j = {{"group", p.group},
            {"batch", p.batch},
            {"q_len", p.q_len},
            {"band_lo", p.band_lo},
            {"band_hi", p.band_hi},
            {"kernel", dg::to_string(p.kernel)},
            {"partition_size", p.partition_size},
            {"partitions", p.max_partitions},
            {"blocks", p.blocks},
            {"target_blocks", p.target_blocks},
            {"live_blocks_at_band_lo", p.live_blocks_at_band_lo},
            {"graph_id", p.graph_id},
            {"band", p.band},
            {"design_len", p.design_len},
            {"window", p.window},
            {"launch_len", p.launch_len},
            {"waves", p.waves},
            {"reason", dg::to_string(p.reason)},
            {"why", dg::describe_reason(p)},
            {"grid", {p.grid_x, p.grid_y, p.grid_z}},
            {"merge_grid", {p.merge_grid_x, p.merge_grid_y}},
            {"workspace_bytes", p.workspace_bytes}};
  // The cost model's one-call predictions the per-band table's "model us" interpolates between.
  auto pred = [](const dg::PlanPrediction& x) {
    return json{{"len", x.len},         {"us", x.us},           {"roof_share", x.roof_share},
                {"loop_us", x.loop_us}, {"fixed_us", x.fixed_us}, {"merge_us", x.merge_us},
                {"launch_us", x.launch_us}, {"issue_us", x.issue_us}};
  };
  j["predicted_lo"] = pred(p.predicted_lo);
  j["predicted_mid"] = pred(p.predicted_mid);
  j["predicted_hi"] = pred(p.predicted_hi);
  if (!p.candidates.empty()) {
    json c = json::array();
    for (const dg::PlanCandidate& k : p.candidates)
      c.push_back({{"kernel", dg::to_string(k.kernel)},
                   {"partition_size", k.partition_size},
                   {"us", num_or_null(k.us, k.us >= 0)}});
    j["candidates"] = c;
  }
  return j;
}

json plans_json(const std::vector<dg::BucketPlan>& plans) {
  json a = json::array();
  for (const dg::BucketPlan& p : plans) a.push_back(plan_json(p));
  return a;
}

json shape_json(const std::string& preset, const dg::AttentionSpec& spec) {
  return {{"preset", preset},
          {"q_heads", spec.num_q_heads},
          {"kv_heads", spec.num_kv_heads},
          {"head_size", spec.head_size},
          {"block_size", spec.block_size},
          {"dtype", dg::to_string(spec.dtype)},
          {"kv_dtype", dg::to_string(spec.kv_dtype)}};
}

json device_model_json(const dg::DeviceModel& d, const std::string& source) {
  return {{"num_sms", d.num_sms}, {"blocks_per_sm", d.blocks_per_sm}, {"target_blocks", d.target_blocks()},
          {"source", source}};
}

void write_json(const std::string& path, const json& j) {
  std::ofstream f(path);
  if (!f) usage_error("--json: cannot write '" + path + "'");
  f << j.dump(2) << "\n";
  if (!f) usage_error("--json: writing '" + path + "' failed");
}

}  // namespace dgloop
