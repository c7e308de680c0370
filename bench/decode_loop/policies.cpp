#include "policies.hpp"

#include <fmt/format.h>

namespace dgloop {

std::vector<PolicyRow> compare_policies(dg::ExecutorConfig cfg, int batch) {
  cfg.policy = dg::KernelPolicy::kAuto;
  const std::vector<dg::BucketPlan> a = dg::plan_buckets(cfg);
  cfg.policy = dg::KernelPolicy::kThreshold;
  const std::vector<dg::BucketPlan> t = dg::plan_buckets(cfg);
  // Each layer group's sliding window (its first layer's spec): a windowed group plans by min(L, W).
  const std::vector<int> group_of = dg::layer_groups_of(cfg);
  auto window_of = [&](int group) {
    for (std::size_t l = 0; l < group_of.size(); ++l)
      if (group_of[l] == group) return (cfg.layer_specs.empty() ? cfg.spec : cfg.layer_specs[l]).sliding_window;
    return 0;
  };
  std::vector<PolicyRow> rows;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].batch != batch) continue;
    PolicyRow r{a[i], t[i], {}};
    const int w = window_of(a[i].group);
    if (a[i].kernel == t[i].kernel && a[i].partition_size == t[i].partition_size)
      r.why = w > 0 && w <= cfg.v2_threshold && a[i].band_hi > cfg.v2_threshold
                  ? fmt::format("same: a {}-token window reads min(L, W) <= {} tokens: no swap", w, w)
              : a[i].band_hi > cfg.v2_threshold ? "same: above the threshold every policy runs V2 (the swap)"
                                                : "same: V1 already fills the GPU";
    else
      r.why = "differ: " + dg::describe_reason(a[i]);
    rows.push_back(std::move(r));
  }
  return rows;
}

namespace {

std::string kernel_label(const dg::BucketPlan& p) {
  return p.kernel == dg::KernelKind::kV2 ? fmt::format("v2 P={}", p.partition_size) : std::string("v1");
}

std::string policies_table(const std::vector<PolicyRow>& rows) {
  constexpr const char* kRow = "{:<5} {:>2} {:<16} {:>10} {:>8}  {:>10} {:>8}  {}\n";
  bool groups = false, n = false;  // a group column only where layers differ, n where some q_len > 1
  for (const PolicyRow& r : rows) groups = groups || r.automatic.group > 0;
  for (const PolicyRow& r : rows) n = n || r.automatic.q_len > 1;
  auto row = [&](const std::string& group, const std::string& q_len, auto&&... rest) {
    std::string line = fmt::format(kRow, group, q_len, rest...);
    if (!n) line.erase(6, 3);
    return groups ? line : line.substr(6);
  };
  std::string s = row("group", "n", "band", "kAuto", "live@lo", "kThreshold", "live@lo", "why");
  for (const PolicyRow& r : rows)
    s += row(std::to_string(r.automatic.group), std::to_string(r.automatic.q_len),
             fmt::format("({}, {}]", r.automatic.band_lo, r.automatic.band_hi),
             kernel_label(r.automatic), r.automatic.live_blocks_at_band_lo, kernel_label(r.threshold),
             r.threshold.live_blocks_at_band_lo, r.why);
  return s;
}

}  // namespace

std::string policies_report(const std::vector<PolicyRow>& rows, int batch, const dg::DeviceModel& model,
                            const std::string& policy, int threshold) {
  return fmt::format(
      "\nkAuto and kThreshold per band (batch bucket {}; {} slots; this run: --policy {}):\n{}"
      "  The swap: above the threshold ({}) every policy replays V2. At or below it kThreshold runs V1,\n"
      "  one block per (sequence, KV head), while kAuto scores V1 and V2 at several partition sizes with\n"
      "  the cost model and keeps the least worst-case regret over the band (predictions, not timings).\n",
      batch, model.target_blocks(), policy, policies_table(rows), threshold);
}

json policies_json(const std::vector<PolicyRow>& rows) {
  json a = json::array();
  auto side = [](const dg::BucketPlan& p) {
    return json{{"kernel", dg::to_string(p.kernel)},
                {"partition_size", p.partition_size},
                {"blocks", p.blocks},
                {"live_blocks_at_band_lo", p.live_blocks_at_band_lo}};
  };
  for (const PolicyRow& r : rows)
    a.push_back({{"q_len", r.automatic.q_len},
                 {"band_lo", r.automatic.band_lo},
                 {"band_hi", r.automatic.band_hi},
                 {"auto", side(r.automatic)},
                 {"threshold", side(r.threshold)},
                 {"why", r.why}});
  return a;
}

}  // namespace dgloop
