#include "policies.hpp"

#include <fmt/format.h>

namespace dgloop {

std::vector<PolicyRow> compare_policies(dg::ExecutorConfig cfg, int batch) {
  cfg.policy = dg::KernelPolicy::kAuto;
  const std::vector<dg::BucketPlan> a = dg::plan_buckets(cfg);
  cfg.policy = dg::KernelPolicy::kThreshold;
  const std::vector<dg::BucketPlan> t = dg::plan_buckets(cfg);
  std::vector<PolicyRow> rows;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].batch != batch) continue;
    PolicyRow r{a[i], t[i], {}};
    if (a[i].kernel == t[i].kernel && a[i].partition_size == t[i].partition_size)
      r.why = a[i].band_hi > cfg.v2_threshold ? "same: above the threshold every policy runs V2 (the swap)"
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
  constexpr const char* kRow = "{:<16} {:>10} {:>8}  {:>10} {:>8}  {}\n";
  std::string s = fmt::format(kRow, "band", "kAuto", "live@lo", "kThreshold", "live@lo", "why");
  for (const PolicyRow& r : rows)
    s += fmt::format(kRow, fmt::format("({}, {}]", r.automatic.band_lo, r.automatic.band_hi),
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
    a.push_back({{"band_lo", r.automatic.band_lo},
                 {"band_hi", r.automatic.band_hi},
                 {"auto", side(r.automatic)},
                 {"threshold", side(r.threshold)},
                 {"why", r.why}});
  return a;
}

}  // namespace dgloop
