// The planner's cost model (executor/cost_model.hpp), worked out by hand on round constants: the
// wave model of pass 1 (whole waves at the roof, a partial last wave at its blocks' own rate, two
// kinds of blocks refilling freed slots, idle blocks), one V1 and one V2 call end to end (bytes,
// merge, floors, the share of the roof), the merge's terms (its latency chain, its bandwidth, the
// merge before issue 19), and the predictions the planner makes for issue 19's shapes against the
// issue's aims where the model reaches them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/cost_model.hpp"
#include "executor/gqa_plan.hpp"
#include "executor/plan.hpp"

namespace {
using namespace decodegraph;
using detail::CostConstants;
using detail::simulate_waves;

// Round numbers: the roof is 10,000 bytes/us, one block alone streams 2,000 bytes/us (so 5
// streaming blocks reach the roof), a block's fixed phase is 1 us, an idle block holds a slot 0.5 us.
CostConstants round_constants() {
  CostConstants k;
  k.read_gbs = 10;
  k.block_gbs = 2;
  k.block_fixed_us = 1;
  k.idle_block_us = 0.5;
  k.kernel_floor_us = 2;
  k.launch_gap_us = 1;
  k.l2_round_trip_us = 0.3;
  k.merge_tree_us = 0.15;
  k.l2_gbs = 100;
  return k;
}

TEST(CostModel, WholeWavesAtTheRoofAndAPartialLastWaveAtItsOwnRate) {
  const CostConstants k = round_constants();
  // 4 blocks of 6,000 bytes, 10 slots: 4 x 2,000 < the roof, each at its own 2,000: 1 + 3 us.
  EXPECT_DOUBLE_EQ(simulate_waves(4, 1, 0, 0, 1, 6000, 10, k), 4.0);
  // 10 blocks: the roof shared, 1,000 each: 1 + 6 us.
  EXPECT_DOUBLE_EQ(simulate_waves(10, 1, 0, 0, 1, 6000, 10, k), 7.0);
  // 13 blocks on 10 slots: a whole wave (7 us), then 3 blocks alone at 2,000 each (1 + 3 us) = 11,
  // where bytes / roof alone would say 1 + 78,000 / 10,000 = 8.8.
  EXPECT_DOUBLE_EQ(simulate_waves(13, 1, 0, 0, 1, 6000, 10, k), 11.0);
  // The same blocks as full partitions instead of tails: the same waves.
  EXPECT_DOUBLE_EQ(simulate_waves(13, 1, 1, 6000, 0, 0, 10, k), 11.0);
  // 8 blocks: the roof shared by 8, 1,250 each: 1 + 4.8 us.
  EXPECT_DOUBLE_EQ(simulate_waves(8, 1, 0, 0, 1, 6000, 8, k), 5.8);
}

TEST(CostModel, ShortLastPartitionsFreeTheirSlotsForTheNextBlocks) {
  const CostConstants k = round_constants();
  // 2 rows of [6,000-byte block, 2,000-byte block], 4 slots: all start, stream at 2,000 each (4 x
  // 2,000 < the roof) after 1 us; the short ones end at 2, the long ones at 4.
  EXPECT_NEAR(simulate_waves(2, 2, 1, 6000, 1, 2000, 4, k), 4.0, 1e-9);
  // 3 rows, 4 slots: [L0 S0 L1 S1] start; at 2 the short ones leave, L2 and S2 start (fixed until
  // 3); L0, L1 end at 4, having streamed 2,000 by 2 and 2,000 more by 3, then 4 stream (8,000 < the
  // roof) so 2,000 more by 4; S2 streams 2,000 from 3 to 4; L2 streams 6,000 from 3: ends at 6.
  EXPECT_NEAR(simulate_waves(3, 2, 1, 6000, 1, 2000, 4, k), 6.0, 1e-9);
}

TEST(CostModel, IdleBlocksCostTheirSlotTimeSpreadOverTheSlots) {
  const CostConstants k = round_constants();
  // 2 rows of one 6,000-byte block and 2 idle ones, 2 slots: the two live blocks run together
  // (1 + 3 us), and 4 idle blocks x 0.5 us over 2 slots add 1 us.
  EXPECT_DOUBLE_EQ(simulate_waves(2, 3, 1, 6000, 0, 0, 2, k), 5.0);
}

// llama-free round shape: one KV head, one query head, head 64, fp32: a token's K+V is 512 bytes.
ExecutorConfig tiny_config() {
  ExecutorConfig c;
  c.spec.num_q_heads = 1;
  c.spec.num_kv_heads = 1;
  c.spec.head_size = 64;
  c.spec.block_size = 16;
  c.spec.dtype = DType::kFloat32;
  c.max_batch = 1;
  c.max_seq_len = 128;
  c.v2_threshold = 128;
  c.band_edges = {128};
  c.device_model = {1, 8};  // 8 slots
  return detail::resolve_planning(c);
}

BucketPlan bucket(const ExecutorConfig& c, KernelKind kernel, int partition_size) {
  BucketPlan p;
  p.batch = 1;
  p.band = 0;
  p.band_lo = 0;
  p.band_hi = 128;
  p.design_len = 64;
  detail::set_launch(p, c, kernel, partition_size);
  return p;
}

TEST(CostModel, OneV1CallByHand) {
  const ExecutorConfig c = tiny_config();
  const CostConstants k = round_constants();
  // 100 tokens: one block streams 51,200 bytes alone: 1 + 25.6 us; one kernel: floor 2 + gap 1.
  const detail::CostBreakdown b = detail::predict_call(c, bucket(c, KernelKind::kV1, 0), 100, k);
  EXPECT_NEAR(b.pass1_us, 26.6, 1e-9);
  EXPECT_EQ(b.merge_us, 0);
  EXPECT_EQ(b.fixed_us, 3);
  EXPECT_NEAR(b.us, 29.6, 1e-9);
  // Bytes as bench counts them: K+V 51,200, q and out 256 each.
  EXPECT_EQ(b.bytes, 51712);
  EXPECT_NEAR(b.roof_share, 51712.0 / (29.6 * 10000), 1e-12);
}

TEST(CostModel, OneV2CallByHand) {
  const ExecutorConfig c = tiny_config();
  const CostConstants k = round_constants();
  // P = 32, 100 tokens: 3 partitions of 32 tokens (16,384 bytes + 264 of partials written) and one of
  // 4 (2,048 + 264); grid x = 4 (128 / 32), all resident. All stream at 2,000 after 1 us: the short
  // one ends at 1 + 2,312 / 2,000 = 2.156, the others at 1 + 16,648 / 2,000 = 9.324.
  const BucketPlan p = bucket(c, KernelKind::kV2, 32);
  ASSERT_EQ(p.grid_x, 4);
  const detail::CostBreakdown b = detail::predict_call(c, p, 100, k);
  EXPECT_NEAR(b.pass1_us, 9.324, 1e-9);
  // The merge: 4 partitions fit the first round of its 4 groups (one L2 round trip + its tree),
  // 2 blocks (one per 32 elements) on one SM: 0.3 + 0.15; its 1,056 bytes at 100 GB/s are 0.01 us.
  EXPECT_NEAR(b.merge_us, 0.45, 1e-9);
  EXPECT_EQ(b.fixed_us, 6);  // two kernels
  EXPECT_NEAR(b.us, 9.324 + 0.45 + 6, 1e-9);
  // Bytes: K+V 51,200, q and out 512, partials written and read 2 x 4 x 264.
  EXPECT_EQ(b.bytes, 51200 + 512 + 2112);
}

TEST(CostModel, TheMergeIsItsChainOrItsBandwidthWhicheverIsLonger) {
  const ExecutorConfig c = tiny_config();
  CostConstants k = round_constants();
  const BucketPlan p = bucket(c, KernelKind::kV2, 32);
  k.l2_gbs = 0.001;  // 1 byte per us: the 1,056 bytes of partials take 1,056 us
  EXPECT_NEAR(detail::predict_call(c, p, 100, k).merge_us, 1056, 1e-6);
  k.l2_bytes = 0;  // partials past L2 come at the read bandwidth: 1,056 / 10,000
  EXPECT_NEAR(detail::predict_call(c, p, 100, k).merge_us, 0.45, 1e-9);
  // The merge before issue 19: max and weights (2 round trips), then 4 partitions per round trip.
  k = round_constants();
  k.serial_merge = true;
  EXPECT_NEAR(detail::predict_call(c, p, 100, k).merge_us, 3 * 0.3 + 0.15, 1e-9);
}

TEST(CostModel, OnePartitionIsACopy) {
  const ExecutorConfig c = tiny_config();
  const CostConstants k = round_constants();
  // P = 128: one partition of 100 tokens (51,200 + 264 bytes): 1 + 25.732 us; the merge one round.
  const detail::CostBreakdown b = detail::predict_call(c, bucket(c, KernelKind::kV2, 128), 100, k);
  EXPECT_NEAR(b.pass1_us, 26.732, 1e-9);
  EXPECT_NEAR(b.merge_us, 0.45, 1e-9);
}

// ---------------------------------------------------------------- issue 19's shapes

// llama3-8b attention, bf16, block 16, on the host model (132 SMs x the pass-1 occupancy); kAuto.
// A plan of a temporary vector would dangle.
const BucketPlan& plan_at(std::vector<BucketPlan>&& plans, int batch, int len) = delete;
const BucketPlan& plan_at(const std::vector<BucketPlan>& plans, int batch, int len) {
  for (const BucketPlan& p : plans)
    if (p.batch == batch && p.band_lo < len && len <= p.band_hi) return p;
  static BucketPlan none;
  ADD_FAILURE() << "no bucket for batch " << batch << " length " << len;
  return none;
}

ExecutorConfig llama3_8b_config(KVLayout layout = KVLayout::kVLLM) {
  ExecutorConfig c;
  c.spec.num_q_heads = 32;
  c.spec.num_kv_heads = 8;
  c.spec.head_size = 128;
  c.spec.block_size = 16;
  c.spec.dtype = DType::kBFloat16;
  c.spec.layout = layout;
  c.max_batch = 64;
  c.max_seq_len = 131072;
  return c;
}

std::vector<BucketPlan> llama3_8b_plans(KVLayout layout) { return plan_buckets(llama3_8b_config(layout)); }

// The issue's aims, as the planner's predicted share of the roof at the shape's length (each shape
// sits at its band's upper edge). Predictions, not measurements: this pins what the planner and the
// model promise, so that a change to either that gives it up shows here. bench/plan_report prints
// the whole table (bench/results/static/plans-issue19.md).
TEST(CostModel, PlansMeetIssue19sAimsWhereTheModelReachesThem) {
  for (KVLayout layout : {KVLayout::kVLLM, KVLayout::kNHD}) {
    const std::vector<BucketPlan> plans = llama3_8b_plans(layout);
    const std::string where = to_string(layout);
    EXPECT_GE(plan_at(plans, 64, 2048).predicted_hi.roof_share, 0.95) << where;   // aim: >= 95 %
    EXPECT_EQ(plan_at(plans, 64, 2048).kernel, KernelKind::kV1) << where;
    EXPECT_GE(plan_at(plans, 1, 4096).predicted_hi.roof_share, 0.40) << where;    // aim: >= 40 %
    EXPECT_GE(plan_at(plans, 8, 32768).predicted_hi.roof_share, 0.90) << where;   // aim: >= 90 %
    EXPECT_GE(plan_at(plans, 8, 131072).predicted_hi.roof_share, 0.90) << where;
    EXPECT_GE(plan_at(plans, 1, 131072).predicted_hi.roof_share, 0.90) << where;
    // Batch 1 at 32K falls just short of 90 %: two kernels' floors and gaps (3.2 us) plus a block's
    // fixed cost and the merge against an ideal of 31 us. The model cannot reach the aim there.
    EXPECT_GE(plan_at(plans, 1, 32768).predicted_hi.roof_share, 0.85) << where;
    // Every bucket at or above 8192 tokens from batch 8: >= 90 % at all three scored lengths.
    for (const BucketPlan& p : plans)
      if (p.band_lo >= 8192 && p.batch >= 8)
        for (const PlanPrediction* x : {&p.predicted_lo, &p.predicted_mid, &p.predicted_hi})
          EXPECT_GE(x->roof_share, 0.90) << where << " batch " << p.batch << " at " << x->len;
  }
}

// The merge at batch 1 x 128K, the issue's target: under 2 us (its latency chain and tree; the
// kernel's floor and launch gap are the fixed term).
TEST(CostModel, TheMergeAtBatch1x128KIsUnder2us) {
  ExecutorConfig c = detail::resolve_planning(llama3_8b_config());
  c.device_model = host_device_model(c.spec);
  const std::vector<BucketPlan> plans = detail::make_plans(c);  // p refers into it
  const BucketPlan& p = plan_at(plans, 1, 131072);
  EXPECT_LT(detail::predict_call(c, p, 131072).merge_us, 2.0);
  // The merge before issue 19 on the plan of b112b12 (P = 784, 168 partitions): 2 + 42 round trips.
  BucketPlan before = p;
  detail::set_launch(before, c, KernelKind::kV2, 784);
  CostConstants k = detail::kCostConstants;
  k.serial_merge = true;
  EXPECT_GT(detail::predict_call(c, before, 131072, k).merge_us, 8.0);
}

}  // namespace
