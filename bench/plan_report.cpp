// plan_report: the planner's predicted share of the roof for issue 19's shapes (llama3-8b
// attention, bf16, block 16; vLLM and NHD layouts), before and after the cost model. Predictions of
// the cost model (executor/cost_model.hpp), never measurements; no GPU and no memory needed.
//   cmake --build build --target plan_report && build/bench/plan_report > bench/results/static/plans-issue19.md
// "Before" is the planner of b112b12: kAuto's fill rule (V1 where one block per (sequence, KV head)
// fills the resident slots, else V2 with the balanced P that fills them at the band's lower edge)
// and the merge of that commit (one serial fold per (sequence, head)), both scored by today's model
// with its merge term switched to that merge. "After" is kAuto today (plan_buckets).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/cost_model.hpp"
#include "executor/gqa_plan.hpp"
#include "executor/plan.hpp"
#include "kernels/occupancy.hpp"

namespace dg = decodegraph;

namespace {

dg::AttentionSpec llama3_8b(dg::KVLayout layout) {
  dg::AttentionSpec s;
  s.num_q_heads = 32;
  s.num_kv_heads = 8;
  s.head_size = 128;
  s.block_size = 16;
  s.dtype = dg::DType::kBFloat16;
  s.layout = layout;
  return s;
}

dg::ExecutorConfig config(const dg::AttentionSpec& s) {
  dg::ExecutorConfig c;
  c.spec = s;
  c.max_batch = 64;
  c.max_seq_len = 131072;
  c = dg::detail::resolve_planning(c);
  c.device_model = dg::host_device_model(s);
  return c;
}

// The plan b112b12's kAuto made for a bucket, and the model's numbers for it with that commit's merge.
dg::BucketPlan before_plan(const dg::ExecutorConfig& c, const dg::BucketPlan& bucket) {
  dg::BucketPlan p = bucket;
  const long long per = static_cast<long long>(p.batch) * c.spec.num_kv_heads * dg::kernels::pass1_head_chunks(c.spec, p.q_len);
  const long long slots = c.device_model.target_blocks();
  if (p.band_hi <= c.v2_threshold && per >= slots) {
    dg::detail::set_launch(p, c, dg::KernelKind::kV1, 0);
  } else {
    const int need = static_cast<int>((slots + per - 1) / per);
    dg::detail::set_launch(p, c, dg::KernelKind::kV2, dg::balanced_partition_size(p.design_len, need, c.spec.block_size));
  }
  return p;
}

std::string label(const dg::BucketPlan& p) {
  char b[64];
  if (p.kernel == dg::KernelKind::kV1)
    std::snprintf(b, sizeof b, "V1");
  else
    std::snprintf(b, sizeof b, "V2 P=%d x %d", p.partition_size, p.max_partitions);
  return b;
}

const dg::BucketPlan& bucket_of(const std::vector<dg::BucketPlan>& plans, int batch, int len) {
  for (const dg::BucketPlan& p : plans)
    if (p.batch == batch && p.band_lo < len && len <= p.band_hi) return p;
  std::fprintf(stderr, "plan_report: no bucket for batch %d length %d\n", batch, len);
  std::exit(2);
}

void row(const char* when, const dg::ExecutorConfig& c, const dg::BucketPlan& p, int len,
         const dg::detail::CostConstants& k) {
  const dg::detail::CostBreakdown b = dg::detail::predict_call(c, p, len, k);
  const long long per = static_cast<long long>(p.grid_y) * p.grid_z;
  const long long live = p.kernel == dg::KernelKind::kV1 ? per : per * dg::num_partitions(len, p.partition_size);
  std::printf("| %s | %s | %lld | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f %% |\n", when, label(p).c_str(), live,
              static_cast<double>(live) / p.target_blocks, b.pass1_us, b.merge_us, b.fixed_us, b.us,
              100 * b.roof_share);
}

}  // namespace

int main() {
  dg::detail::CostConstants before_k = dg::detail::kCostConstants;
  before_k.serial_merge = true;
  const dg::detail::CostConstants& after_k = dg::detail::kCostConstants;
  struct Shape {
    int batch, len;
  };
  const Shape shapes[] = {{1, 32768}, {8, 32768}, {1, 131072}, {8, 131072}, {64, 2048}, {1, 4096}};

  std::printf("# Planner predictions for issue 19's shapes\n\n");
  std::printf("Output of `build/bench/plan_report` (bench/plan_report.cpp; `cmake --build build --target plan_report`):\n"
              "**predictions** of the planner's cost model (executor/cost_model.hpp, docs/planning.md), not\n"
              "measurements; no GPU has run these plans.\n"
              "llama3-8b attention (32 q heads, 8 KV heads, head 128), bf16, block 16, one layer, every sequence\n"
              "at the length shown; the host device model (132 SMs x the pass-1 kernel's occupancy). Roof share =\n"
              "bench's bytes model (K+V, q, out, V2 partials) / (time x %.0f GB/s). Before: b112b12's kAuto (fill\n"
              "rule) and merge (one serial fold per (sequence, head)); after: kAuto's cost model and the folded merge.\n\n",
              after_k.read_gbs);
  std::printf("The model's constants (executor/cost_model.hpp, none measured yet): read %.0f GB/s, one block alone\n"
              "%.1f GB/s, block fixed %.2f us, idle block %.2f us, kernel floor %.2f us, launch gap %.2f us, L2 round\n"
              "trip %.2f us, L2 %.0f GB/s, merge tree %.2f us.\n\n",
              after_k.read_gbs, after_k.block_gbs, after_k.block_fixed_us, after_k.idle_block_us, after_k.kernel_floor_us,
              after_k.launch_gap_us, after_k.l2_round_trip_us, after_k.l2_gbs, after_k.merge_tree_us);
  for (dg::KVLayout layout : {dg::KVLayout::kVLLM, dg::KVLayout::kNHD}) {
    const dg::ExecutorConfig c = config(llama3_8b(layout));
    const std::vector<dg::BucketPlan> after = dg::detail::make_plans(c);
    std::printf("## %s layout: %d SMs x %d blocks = %d resident pass-1 blocks\n\n", to_string(layout),
                c.device_model.num_sms, c.device_model.blocks_per_sm, c.device_model.target_blocks());
    std::printf("| shape | | plan | live blocks | waves | pass 1 us | merge us | fixed us | total us | roof share |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const Shape& sh : shapes) {
      const dg::BucketPlan& a = bucket_of(after, sh.batch, sh.len);
      std::printf("| batch %d x %d ", sh.batch, sh.len);
      row("before", c, before_plan(c, a), sh.len, before_k);
      std::printf("| | ");
      row("after", c, a, sh.len, after_k);
    }
    // Every bucket at or above 8192 tokens, batch 1-64: the worst of the three scored lengths.
    std::printf("\nEvery bucket with band_lo >= 8192 (batch buckets 1-64), after: predicted roof share at the band's\n"
                "lower edge / middle / upper edge, and the lowest of the three.\n\n");
    std::printf("| batch | band | plan | lo | mid | hi | lowest |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    double worst = 1;
    for (const dg::BucketPlan& p : after) {
      if (p.band_lo < 8192) continue;
      const double lo = std::min({p.predicted_lo.roof_share, p.predicted_mid.roof_share, p.predicted_hi.roof_share});
      worst = std::min(worst, lo);
      std::printf("| %d | (%d, %d] | %s | %.1f %% | %.1f %% | %.1f %% | %.1f %% |\n", p.batch, p.band_lo, p.band_hi,
                  label(p).c_str(), 100 * p.predicted_lo.roof_share, 100 * p.predicted_mid.roof_share,
                  100 * p.predicted_hi.roof_share, 100 * lo);
    }
    std::printf("\nLowest over those buckets: %.1f %%.\n\n", 100 * worst);
  }
  return 0;
}
