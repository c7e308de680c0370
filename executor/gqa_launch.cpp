// A V1/V2 (GQA) launch of a bucket (gqa_plan.hpp): the pass-1 grid of (partition, KV head x head
// chunk, sequence), the partitions and workspace a V2 launch covers, the merge grid, the block
// counts the plan table shows, and the cost model's predictions of that launch at the band's three
// lengths. Each policy (gqa_policy.cpp) picks a kernel and partition size; this sets the rest.
#include <algorithm>
#include <array>

#include "decodegraph/attention.hpp"
#include "executor/cost_model.hpp"
#include "executor/gqa_plan.hpp"
#include "executor/plan.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_policy.hpp"
#include "kernels/merge_policy.hpp"
#include "kernels/occupancy.hpp"

namespace decodegraph::detail {

long long blocks_per_partition(const AttentionSpec& spec, int batch, int q_len) {
  return static_cast<long long>(batch) * spec.num_kv_heads * kernels::pass1_head_chunks(spec, q_len);
}

long long pass1_slots(const ExecutorConfig& c, int q_len) {
  const kernels::KernelResources one = kernels::pass1_resources(c.spec, 1), rows = kernels::pass1_resources(c.spec, q_len);
  if (one.threads == rows.threads && one.registers == rows.registers && one.smem_bytes == rows.smem_bytes)
    return c.device_model.target_blocks();
  return static_cast<long long>(c.device_model.num_sms) * kernels::blocks_per_sm(rows);
}

namespace {

PlanPrediction prediction(const ExecutorConfig& c, const BucketPlan& p, int len) {
  const CostBreakdown b = predict_call(c, p, len);
  return PlanPrediction{len, b.us, b.roof_share, b.loop_us, b.fixed_us, b.merge_us, b.launch_us, b.issue_us};
}

}  // namespace

void set_launch(BucketPlan& p, const ExecutorConfig& c, KernelKind kernel, int partition_size) {
  const long long per_part = blocks_per_partition(c.spec, p.batch, p.q_len);
  p.kernel = kernel;
  p.grid_y = c.spec.num_kv_heads * kernels::pass1_head_chunks(c.spec, p.q_len);
  p.grid_z = p.batch;
  if (kernel == KernelKind::kV1) {
    // NOTE(graph): V1 launches are sized for the largest V1 band edge, not their own band_hi, so a
    // batch bucket's V1 launches are identical across bands and share a graph. The grid does not
    // depend on it; lengths are read from device memory and clamped to it, and max_blocks_per_seq
    // covers it (it is <= max_seq_len). A plan whose planned length is shorter than its band (a
    // window) may run V1 above the threshold: its launch still covers the band.
    p.launch_len = std::max(std::min(c.v2_threshold, c.max_seq_len), p.band_hi);
    p.partition_size = 0;
    p.max_partitions = 1;
    p.merge_grid_x = p.merge_grid_y = p.merge_grid_z = 0;
    p.workspace_bytes = 0;
  } else {
    p.launch_len = p.band_hi;
    p.partition_size = partition_size;
    // A window's partitions cover what it reads (its first block on), as the workspace does.
    // q_len rows read the window of their first row on: W + q_len - 1 tokens.
    p.max_partitions = num_partitions(
        math::window_read_max(p.band_hi, math::read_window(c.spec.sliding_window, p.q_len), c.spec.block_size),
        partition_size);
    // One merge block per (query row x query head, 32 elements): kernels/merge_partitions.cuh.
    p.merge_grid_x = c.spec.num_q_heads * p.batch * p.q_len;
    p.merge_grid_y = 1;
    p.merge_grid_z = kernels::merge_slices(c.spec.head_size);
    p.workspace_bytes = v2_workspace_size(c.spec, p.batch, p.band_hi, partition_size, p.q_len);
  }
  p.grid_x = p.max_partitions;
  const long long live_parts = kernel == KernelKind::kV1 ? 1 : num_partitions(p.design_len, partition_size);
  p.blocks = static_cast<int>(p.grid_x * per_part);
  p.target_blocks = static_cast<int>(pass1_slots(c, p.q_len));
  p.live_blocks_at_band_lo = static_cast<int>(live_parts * per_part);
  p.waves = static_cast<double>(p.blocks) / std::max(1, p.target_blocks);
  const std::array<int, 3> lens = band_lengths(c, p);
  p.predicted_lo = prediction(c, p, lens[0]);
  p.predicted_mid = prediction(c, p, lens[1]);
  p.predicted_hi = prediction(c, p, lens[2]);
  p.predicted_regret = 0;  // kAuto's choice sets these after its scoring
  p.candidates_scored = 0;
}

}  // namespace decodegraph::detail
