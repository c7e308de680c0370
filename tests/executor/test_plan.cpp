// Planning, host-only (no step runs): default bands and buckets, head chunks, the balanced partition
// size, the fill rule's plans (kThreshold) worked out by hand on a fixed H200 device model (132 SMs x
// 5 blocks), kAuto's cost-model plans (the candidates it scores, by hand; the plan it keeps is the
// least worst-case regret; where the model's arithmetic decides by itself, V1 or one partition),
// the plans' invariants as property tests over random shapes, device models and band edges, graph
// sharing, the device model's defaults, the plan table, and plan lookup by index or by size.
// The cost model's own arithmetic is checked by hand in test_cost_model.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"
#include "executor/cost_model.hpp"
#include "executor/gqa_plan.hpp"
#include "executor/plan.hpp"
#include "kernels/occupancy.hpp"

namespace {
using namespace decodegraph;
using dgtest::World;

AttentionSpec make_spec(int q, int kv, int head = 128, int block = 16, DType dtype = DType::kBFloat16) {
  AttentionSpec s;
  s.num_q_heads = q;
  s.num_kv_heads = kv;
  s.head_size = head;
  s.block_size = block;
  s.dtype = dtype;
  return s;
}

// The device model every table-driven test pins, so that kernel changes to the occupancy of the
// current pass-1 kernel (which the default host model follows) cannot move these numbers.
DeviceModel h200() {
  DeviceModel d;
  d.num_sms = 132;
  d.blocks_per_sm = 5;
  return d;
}

ExecutorConfig plan_config(const AttentionSpec& s, int max_batch, int max_seq_len, KernelPolicy policy) {
  ExecutorConfig c;
  c.spec = s;
  c.max_batch = max_batch;
  c.max_seq_len = max_seq_len;
  c.policy = policy;
  c.device_model = h200();
  return c;
}

const BucketPlan& find_plan(const std::vector<BucketPlan>& plans, int batch, int band_hi) {
  for (const BucketPlan& p : plans)
    if (p.batch == batch && p.band_hi == band_hi) return p;
  static BucketPlan none;
  ADD_FAILURE() << "no plan for batch " << batch << " band_hi " << band_hi;
  return none;
}

TEST(Plan, DefaultBandEdgesArePowersOfTwoPlusThreshold) {
  EXPECT_EQ(default_band_edges(32768, 8192), (std::vector<int>{512, 1024, 2048, 4096, 8192, 16384, 32768}));
  EXPECT_EQ(default_band_edges(20000, 6000),
            (std::vector<int>{512, 1024, 2048, 4096, 6000, 8192, 16384, 20000}));
  EXPECT_EQ(default_band_edges(300, 8192), (std::vector<int>{300}));
}

TEST(Plan, DefaultBatchBuckets) {
  EXPECT_EQ(default_batch_buckets(1), (std::vector<int>{1}));
  EXPECT_EQ(default_batch_buckets(7), (std::vector<int>{1, 2, 4, 7}));
  EXPECT_EQ(default_batch_buckets(30), (std::vector<int>{1, 2, 4, 8, 16, 24, 30}));
  const std::vector<int> b = default_batch_buckets(300);
  EXPECT_EQ(b.front(), 1);
  EXPECT_EQ(b.back(), 300);
  EXPECT_NE(std::find(b.begin(), b.end(), 256), b.end());
  EXPECT_NE(std::find(b.begin(), b.end(), 272), b.end());
  EXPECT_NE(std::find(b.begin(), b.end(), 288), b.end());
  EXPECT_EQ(std::find(b.begin(), b.end(), 264), b.end());  // steps of 16 beyond 256
}

// A block serves at most 16 query heads of its group; bigger groups are split along grid y.
TEST(Plan, HeadChunksFollowTheLauncher) {
  const std::vector<std::pair<int, int>> cases = {{1, 1},  {4, 1},  {5, 1},  {8, 1},
                                                  {16, 1}, {20, 2}, {32, 2}, {64, 4}};  // group -> chunks
  for (auto [group, chunks] : cases)
    EXPECT_EQ(kernels::pass1_head_chunks(make_spec(group * 2, 2)), chunks) << "group " << group;
}

// ---------------------------------------------------------------- the partition size

TEST(Plan, BalancedPartitionSizeByHand) {
  // Even split of L into k, rounded up to whole blocks: 8192 / 2 = 4096 (the seed picked 8176, the
  // longest P that still gave 2 partitions, so the second held 16 tokens).
  EXPECT_EQ(balanced_partition_size(8192, 2, 16), 4096);
  EXPECT_EQ(balanced_partition_size(2048, 6, 16), 352);  // ceil(2048/6) = 342 -> 352: 6 partitions
  // Rounding up loses a partition: ceil(32768/83) = 395 -> 400 gives 82 (as do 84, 85 -> 400);
  // k = 86: ceil(32768/86) = 382 -> 384 gives 86 >= 83.
  EXPECT_EQ(balanced_partition_size(32768, 83, 16), 384);
  // k = 30: 274 -> 288 gives 29; k = 31: 265 -> 272 gives 31.
  EXPECT_EQ(balanced_partition_size(8192, 30, 16), 272);
  // Block size 8: 274 -> 280 gives ceil(8192/280) = 30 at once.
  EXPECT_EQ(balanced_partition_size(8192, 30, 8), 280);
  // Block size 32: 288 gives 29 for k = 30 and 31; k = 32 reaches the minimum, 256 -> 32 partitions.
  EXPECT_EQ(balanced_partition_size(8192, 30, 32), 256);
  // The minimum partition (256) caps the count: 512 tokens make 2 partitions however many are wanted.
  EXPECT_EQ(balanced_partition_size(512, 83, 16), 256);
  EXPECT_EQ(balanced_partition_size(100, 5, 16), 256);  // shorter than the minimum: one partition
  EXPECT_EQ(balanced_partition_size(5000, 1, 16), 5008);  // one partition: round_up(5000, 16)
  EXPECT_THROW(balanced_partition_size(0, 1, 16), Error);
}

// ---------------------------------------------------------------- the fill rule (kThreshold), by hand

// kThreshold keeps the plain rule, no model: V1 up to v2_threshold; above it V2 with the balanced P
// that fills target_blocks at the band's lower edge (kAuto's rule before the cost model, so these
// tables, worked out by hand for it, now pin kThreshold). With v2_threshold = 512 every band above
// (0, 512] is V2 under the fill rule.

struct Row {
  int batch;
  int band_hi;  // contexts 1K, 4K, 8K, 16K, 64K sit in bands (512,1K], (2K,4K], (4K,8K], (8K,16K], (32K,64K]
  KernelKind kernel;
  int p;       // partition size (V2), 0 for V1
  int parts;   // grid x: partitions of band_hi (V1: 1)
  int blocks;  // grid x * kv heads * head chunks * batch
  int live;    // blocks with work at the band's lower edge
};

struct ShapeTable {
  const char* name;
  AttentionSpec spec;
  std::vector<Row> rows;
};

constexpr KernelKind V1 = KernelKind::kV1;
constexpr KernelKind V2 = KernelKind::kV2;

// target = 132 x 5 = 660. Blocks per partition ("per") = batch x kv heads x head chunks. V2 needs
// ceil(660 / per) partitions at the lower edge L, with partitions of at least 256 tokens;
// P = round_up(ceil(L / k), 16) for the smallest k >= need that still gives need partitions (or 256
// when L / 256 is fewer).
// Rows that share "per" share every number, which is why some shapes repeat others' rows.
std::vector<Row> per8() {  // per = 8 x batch: llama3-8b (8 kv), 40q/8kv
  return {
      // batch 1: per 8, need 83. Bands up to 16K: L / 256 = 2, 8, 16, 32 partitions, all < 83 -> 256.
      {1, 1024, V2, 256, 4, 32, 16},
      {1, 4096, V2, 256, 16, 128, 64},
      {1, 8192, V2, 256, 32, 256, 128},
      {1, 16384, V2, 256, 64, 512, 256},
      // L = 32768: 400 gives 82, 384 (k = 86) gives 86; 65536 / 384 -> 171 partitions; live 86 x 8.
      {1, 65536, V2, 384, 171, 1368, 688},
      // batch 4: per 32, need 21. 1K / 4K / 8K capped at 2 / 8 / 16 partitions of 256.
      {4, 1024, V2, 256, 4, 128, 64},
      {4, 4096, V2, 256, 16, 512, 256},
      {4, 8192, V2, 256, 32, 1024, 512},
      // L = 8192: ceil(8192/21) = 391 -> 400, 21 partitions; 16384 / 400 -> 41. live 21 x 32 = 672.
      {4, 16384, V2, 400, 41, 1312, 672},
      // L = 32768: ceil(32768/21) = 1561 -> 1568, 21 partitions; 65536 / 1568 -> 42.
      {4, 65536, V2, 1568, 42, 1344, 672},
      // batch 16: per 128, need 6. L = 512 -> 2 x 256. L = 2048: 342 -> 352; 4096: 683 -> 688;
      // 8192: 1366 -> 1376; 32768: 5462 -> 5472; each 6 at L and 12 at band_hi. live 6 x 128 = 768.
      {16, 1024, V2, 256, 4, 512, 256},
      {16, 4096, V2, 352, 12, 1536, 768},
      {16, 8192, V2, 688, 12, 1536, 768},
      {16, 16384, V2, 1376, 12, 1536, 768},
      {16, 65536, V2, 5472, 12, 1536, 768},
      // batch 64: per 512 < 660: need 2: P = L / 2.
      {64, 1024, V2, 256, 4, 2048, 1024},
      {64, 4096, V2, 1024, 4, 2048, 1024},
      {64, 8192, V2, 2048, 4, 2048, 1024},
      {64, 16384, V2, 4096, 4, 2048, 1024},
      {64, 65536, V2, 16384, 4, 2048, 1024},
  };
}

std::vector<ShapeTable> tables() {
  std::vector<ShapeTable> t;
  t.push_back({"llama3-8b", make_spec(32, 8), per8()});
  t.push_back({"head80-40q8kv", make_spec(40, 8, 80), per8()});  // group 5: one chunk of 8 heads
  // llama3-70b-tp8, 8q/1kv: per = batch.
  t.push_back({"llama3-70b-tp8",
               make_spec(8, 1),
               {
                   // batch 1 (need 660) and 4 (need 165): always the minimum partition, 256.
                   {1, 1024, V2, 256, 4, 4, 2},
                   {1, 4096, V2, 256, 16, 16, 8},
                   {1, 8192, V2, 256, 32, 32, 16},
                   {1, 16384, V2, 256, 64, 64, 32},
                   {1, 65536, V2, 256, 256, 256, 128},
                   {4, 1024, V2, 256, 4, 16, 8},
                   {4, 4096, V2, 256, 16, 64, 32},
                   {4, 8192, V2, 256, 32, 128, 64},
                   {4, 16384, V2, 256, 64, 256, 128},
                   {4, 65536, V2, 256, 256, 1024, 512},
                   // batch 16, need 42: 256 up to 16K (2..32 partitions); L = 32768: 781 -> 784, 42
                   // partitions; 65536 / 784 -> 84.
                   {16, 1024, V2, 256, 4, 64, 32},
                   {16, 4096, V2, 256, 16, 256, 128},
                   {16, 8192, V2, 256, 32, 512, 256},
                   {16, 16384, V2, 256, 64, 1024, 512},
                   {16, 65536, V2, 784, 84, 1344, 672},
                   // batch 64, need 11: 1K, 4K capped (2, 8); L = 4096: 373 -> 384; 8192: 745 -> 752;
                   // 32768: 2979 -> 2992; 11 at L, 22 at band_hi, live 704.
                   {64, 1024, V2, 256, 4, 256, 128},
                   {64, 4096, V2, 256, 16, 1024, 512},
                   {64, 8192, V2, 384, 22, 1408, 704},
                   {64, 16384, V2, 752, 22, 1408, 704},
                   {64, 65536, V2, 2992, 22, 1408, 704},
               }});
  // MHA 32/32: per = 32 x batch, so batch b plans like per8()'s batch 4b, until batch 64: per 2048
  // >= 660 needs one partition at L: P = L, two at band_hi.
  std::vector<Row> mha;
  for (const Row& r : per8())
    if (r.batch >= 4) mha.push_back({r.batch / 4, r.band_hi, r.kernel, r.p, r.parts, r.blocks, r.live});
  for (int hi : {1024, 4096, 8192, 16384}) mha.push_back({64, hi, V2, hi / 2, 2, 4096, 2048});
  mha.push_back({64, 65536, V2, 32768, 2, 4096, 2048});
  t.push_back({"mha", make_spec(32, 32), mha});
  // 32q/1kv: a group of 32 is two chunks of 16 heads, per = 2 x batch: batch b plans like per8()'s
  // batch b/4 (batch 1 is its own: need 330, always 256).
  std::vector<Row> g32 = {{1, 1024, V2, 256, 4, 8, 4},
                          {1, 4096, V2, 256, 16, 32, 16},
                          {1, 8192, V2, 256, 32, 64, 32},
                          {1, 16384, V2, 256, 64, 128, 64},
                          {1, 65536, V2, 256, 256, 512, 256}};
  for (const Row& r : per8())
    if (r.batch <= 16) g32.push_back({r.batch * 4, r.band_hi, r.kernel, r.p, r.parts, r.blocks, r.live});
  t.push_back({"gqa32-32q1kv", make_spec(32, 1), g32});
  return t;
}

TEST(Plan, TableDrivenFillRulePlansOnTheH200Model) {
  for (const ShapeTable& t : tables()) {
    ExecutorConfig c = plan_config(t.spec, 64, 131072, KernelPolicy::kThreshold);
    c.v2_threshold = 512;
    const std::vector<BucketPlan> plans = plan_buckets(c);
    ASSERT_EQ(plans.size(), 11u * 9u) << t.name;  // buckets 1 2 4 8 16 24 .. 64; bands 512 .. 131072
    for (const Row& r : t.rows) {
      const BucketPlan& p = find_plan(plans, r.batch, r.band_hi);
      const std::string where = std::string(t.name) + " batch " + std::to_string(r.batch) + " band_hi " +
                                std::to_string(r.band_hi);
      EXPECT_EQ(p.kernel, r.kernel) << where;
      EXPECT_EQ(p.partition_size, r.p) << where;
      EXPECT_EQ(p.max_partitions, r.parts) << where;
      EXPECT_EQ(p.grid_x, r.parts) << where;
      EXPECT_EQ(p.blocks, r.blocks) << where;
      EXPECT_EQ(p.live_blocks_at_band_lo, r.live) << where;
      EXPECT_EQ(p.target_blocks, 660) << where;
      EXPECT_EQ(p.design_len, p.band_hi / 2) << where;  // every band here doubles
      EXPECT_DOUBLE_EQ(p.waves, r.blocks / 660.0) << where;
      EXPECT_EQ(p.reason, PlanReason::kAboveThreshold) << where;
    }
  }
}

TEST(Plan, ThresholdPolicyIsTheSeedRuleWithFillPartitions) {
  const AttentionSpec s = make_spec(32, 8);
  const auto thr = plan_buckets(plan_config(s, 64, 131072, KernelPolicy::kThreshold));
  for (const BucketPlan& p : thr) {
    EXPECT_EQ(p.kernel, p.band_hi <= 8192 ? V1 : V2) << p.band_hi;
    if (p.kernel == V2) {
      // The fill rule, from its definition: ceil(660 / per) balanced partitions at the lower edge.
      const int need = static_cast<int>((660 + 8 * p.batch - 1) / (8 * p.batch));
      EXPECT_EQ(p.partition_size, balanced_partition_size(p.design_len, need, 16)) << p.batch << " " << p.band_hi;
      EXPECT_EQ(p.reason, PlanReason::kAboveThreshold);
    } else {
      EXPECT_EQ(p.reason, PlanReason::kThresholdRule);
      EXPECT_EQ(p.blocks, 8 * p.batch);  // one block per (sequence, KV head)
    }
    EXPECT_GT(p.predicted_hi.us, 0) << "every policy's plans carry the model's prediction";
    EXPECT_EQ(p.predicted_regret, 0);
    EXPECT_EQ(p.candidates_scored, 0);
  }
  // Batch 1 at 4K: kThreshold runs 8 blocks.
  EXPECT_EQ(find_plan(thr, 1, 4096).blocks, 8);
}

TEST(Plan, MeasuredPolicyStartsFromAutoAndListsItsCandidates) {
  const AttentionSpec s = make_spec(32, 8);
  ExecutorConfig c = plan_config(s, 16, 32768, KernelPolicy::kAuto);
  c.num_layers = 3;
  const auto aut = plan_buckets(c);
  c.policy = KernelPolicy::kMeasured;
  const auto mea = plan_buckets(c);
  for (std::size_t i = 0; i < mea.size(); ++i) {
    EXPECT_EQ(mea[i].kernel, aut[i].kernel);
    EXPECT_EQ(mea[i].partition_size, aut[i].partition_size);
    EXPECT_EQ(mea[i].reason, PlanReason::kNotMeasured);
    EXPECT_EQ(mea[i].graph_id, -1) << "decided only when measured";
  }
  // Batch 1, band (4096, 8192]: kAuto runs V2 at P; the candidates are V1, P, half and twice it
  // (each a multiple of the block size, at least 64 tokens, shorter than the band's longest).
  const BucketPlan& p = find_plan(mea, 1, 8192);
  ASSERT_EQ(p.kernel, V2);
  const int P = p.partition_size;
  std::vector<int> want = {P};
  if (P / 2 / 16 * 16 >= 64) want.push_back(P / 2 / 16 * 16);
  if (2 * P < 8192) want.push_back(2 * P);
  ASSERT_EQ(p.candidates.size(), 1 + want.size());
  EXPECT_EQ(p.candidates[0].kernel, V1);
  for (std::size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(p.candidates[k + 1].kernel, V2);
    EXPECT_EQ(p.candidates[k + 1].partition_size, want[k]);
  }
  // Each candidate carries the model's time for what kMeasured times: 3 layers, every sequence at
  // the band's middle (what that launch's plan predicts there, times the layers).
  ExecutorConfig r = detail::resolve_planning(c);
  for (const PlanCandidate& k : p.candidates) {
    EXPECT_EQ(k.us, -1);
    BucketPlan t = p;
    detail::set_launch(t, r, k.kernel, k.partition_size);
    EXPECT_DOUBLE_EQ(k.predicted_us, 3 * t.predicted_mid.us) << k.partition_size;
    EXPECT_EQ(t.predicted_mid.len, 4097 + 2048);  // lower edge 4097, half the band past it
  }
  // Above the threshold V1 is no candidate.
  for (const PlanCandidate& k : find_plan(mea, 1, 16384).candidates) EXPECT_EQ(k.kernel, V2);
}

// ---------------------------------------------------------------- invariants, as properties

int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}
long long cdiv(long long a, long long b) { return (a + b - 1) / b; }

// Streaming blocks it takes to reach the model's roof: read bandwidth / one block's rate.
long long roof_blocks() {
  return static_cast<long long>(std::ceil(detail::kCostConstants.read_gbs / detail::kCostConstants.block_gbs));
}

// kAuto's plan against its own candidates: the regret recomputed here from the candidates'
// predictions (the best time per length, the worst ratio), the plan's is the least.
::testing::AssertionResult is_least_regret(const BucketPlan& p, const ExecutorConfig& resolved) {
  const std::vector<detail::ScoredPlan> cands = detail::auto_candidates(p, resolved);
  if (static_cast<int>(cands.size()) != p.candidates_scored)
    return ::testing::AssertionFailure() << cands.size() << " candidates, the plan says " << p.candidates_scored;
  double best[3] = {1e300, 1e300, 1e300};
  auto at = [](const BucketPlan& b, int i) { return i == 0 ? b.predicted_lo.us : i == 1 ? b.predicted_mid.us : b.predicted_hi.us; };
  for (const auto& c : cands)
    for (int i = 0; i < 3; ++i) best[i] = std::min(best[i], at(c.plan, i));
  double least = 1e300, mine = -1;
  for (const auto& c : cands) {
    double r = 0;
    for (int i = 0; i < 3; ++i) r = std::max(r, at(c.plan, i) / best[i] - 1);
    least = std::min(least, r);
    if (c.plan.kernel == p.kernel && c.plan.partition_size == p.partition_size) mine = r;
  }
  if (mine < 0) return ::testing::AssertionFailure() << "the plan is none of its candidates";
  if (std::fabs(mine - p.predicted_regret) > 1e-12)
    return ::testing::AssertionFailure() << "regret " << p.predicted_regret << ", recomputed " << mine;
  if (mine > least + 1e-9) return ::testing::AssertionFailure() << "regret " << mine << " > least " << least;
  return ::testing::AssertionSuccess();
}

TEST(Plan, InvariantsHoldOverRandomShapesDeviceModelsAndBands) {
  std::mt19937_64 rng(20240611);
  const int heads[] = {64, 80, 96, 112, 128, 192, 256};
  const int blocks[] = {8, 16, 32};
  const int kvs[] = {1, 2, 4, 8, 32};
  const int groups[] = {1, 2, 4, 5, 8, 16, 20, 32};
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  auto in = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int v1_plans = 0, v2_plans = 0, fill_v2 = 0, capped = 0, shared = 0, v1_by_arithmetic = 0, one_part = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int kv = kvs[pick(5)];
    const int group = groups[pick(8)];
    const AttentionSpec s = make_spec(kv * group, kv, heads[pick(7)], blocks[pick(3)],
                                      static_cast<DType>(pick(3)));
    ExecutorConfig c;
    c.spec = s;
    c.max_batch = in(1, 300);
    c.max_seq_len = in(1, 200000);
    c.v2_threshold = in(1, c.max_seq_len + 100);
    if (trial % 2) {  // random band edges containing the threshold
      std::set<int> e = {c.max_seq_len};
      if (c.v2_threshold < c.max_seq_len) e.insert(c.v2_threshold);
      for (int k = in(0, 6); k > 0; --k) e.insert(in(1, c.max_seq_len));
      c.band_edges.assign(e.begin(), e.end());
    }
    c.device_model.num_sms = in(1, 200);
    c.device_model.blocks_per_sm = in(1, 32);
    const long long target = static_cast<long long>(c.device_model.num_sms) * c.device_model.blocks_per_sm;
    const int bs = s.block_size;
    const long long min_p = cdiv(256, bs) * bs;       // the fill rule's
    const long long auto_min_p = cdiv(64, bs) * bs;   // kAuto's shortest (one cache block up to 1,024 planned tokens)
    const int chunks = cdiv(group, next_pow2(std::min(group, 16)));

    c.policy = KernelPolicy::kAuto;
    const std::vector<BucketPlan> aut = plan_buckets(c);
    const ExecutorConfig resolved = detail::resolve_planning(c);
    c.policy = KernelPolicy::kThreshold;
    const std::vector<BucketPlan> thr = plan_buckets(c);
    ASSERT_EQ(aut.size(), thr.size());
    std::map<int, BucketPlan> by_graph;
    std::set<std::tuple<int, int, int, int, int>> launches;
    for (std::size_t i = 0; i < aut.size(); ++i) {
      const BucketPlan& p = aut[i];
      const std::string where = "trial " + std::to_string(trial) + " batch " + std::to_string(p.batch) +
                                " band (" + std::to_string(p.band_lo) + "," + std::to_string(p.band_hi) + "]";
      const long long per = static_cast<long long>(p.batch) * kv * chunks;
      const long long len = p.band_lo > 0 ? p.band_lo : std::max(1, p.band_hi / 2);
      for (const BucketPlan* q : {&p, &thr[i]}) {
        ASSERT_EQ(q->design_len, len) << where;
        ASSERT_EQ(q->grid_y, kv * chunks) << where;
        ASSERT_EQ(q->grid_z, q->batch) << where;
        ASSERT_EQ(q->blocks, static_cast<long long>(q->grid_x) * q->grid_y * q->grid_z) << where;
        ASSERT_EQ(q->target_blocks, target) << where;
        // Predictions at the band's three lengths, for both policies.
        const int lo_len = q->band_lo > 0 ? q->band_lo + 1 : std::max(1, q->band_hi / 2);
        ASSERT_EQ(q->predicted_lo.len, lo_len) << where;
        ASSERT_EQ(q->predicted_mid.len, lo_len + (q->band_hi - lo_len + 1) / 2) << where;
        ASSERT_EQ(q->predicted_hi.len, q->band_hi) << where;
        for (const PlanPrediction* x : {&q->predicted_lo, &q->predicted_mid, &q->predicted_hi}) {
          ASSERT_GT(x->us, 0) << where;
          ASSERT_GT(x->roof_share, 0) << where;
          // The K+V bytes, which come from DRAM, never beat the roof (the share itself counts q, out
          // and the partials too, as bench does, and those can come from L2).
          const double kv_bytes = 2.0 * q->batch * x->len * kv * s.head_size * static_cast<double>(dtype_size(s.dtype));
          ASSERT_LE(kv_bytes / (x->us * detail::kCostConstants.read_gbs * 1000.0), 1.0 + 1e-9) << where;
        }
        if (q->kernel == V1) {
          // A V1 launch never exceeds what the block table covers (max_seq_len) and covers the band.
          ASSERT_GE(q->launch_len, q->band_hi) << where;
          ASSERT_LE(q->launch_len, c.max_seq_len) << where;
          ASSERT_EQ(q->workspace_bytes, 0u) << where;
          ASSERT_EQ(q->live_blocks_at_band_lo, per) << where;
        } else {
          ASSERT_EQ(q->partition_size % bs, 0) << where;
          ASSERT_EQ(q->max_partitions, cdiv(q->band_hi, q->partition_size)) << where;
          ASSERT_EQ(q->launch_len, q->band_hi) << where;
          ASSERT_EQ(q->workspace_bytes, v2_workspace_size(s, q->batch, q->band_hi, q->partition_size)) << where;
        }
      }
      // Every band above the threshold is V2, under both policies; kThreshold is the seed's rule.
      if (p.band_hi > c.v2_threshold) ASSERT_EQ(p.kernel, V2) << where;
      ASSERT_EQ(thr[i].kernel, p.band_hi <= c.v2_threshold ? V1 : V2) << where;

      // kThreshold's V2: the fill rule.
      if (thr[i].kernel == V2) {
        ++fill_v2;
        const long long P = thr[i].partition_size;
        ASSERT_GE(P, min_p) << where;
        // Balanced: P is the even split of L over its own partition count, rounded up to a block
        // (or the minimum partition): no partition but the last is longer than it needs to be.
        const long long n = cdiv(len, P);
        ASSERT_EQ(P, std::max(min_p, cdiv(cdiv(len, n), bs) * bs)) << where << " P " << P;
        ASSERT_EQ(thr[i].live_blocks_at_band_lo, n * per) << where;
        // Live blocks at the lower edge reach the target wherever the minimum partition allows it.
        const long long need = cdiv(target, per);
        if (cdiv(len, min_p) >= need)
          ASSERT_GE(thr[i].live_blocks_at_band_lo, target) << where << " P " << P;
        else
          ++capped;
        // And with as few partitions as that takes: no longer balanced P also reaches it.
        for (long long q = P + bs; q <= cdiv(len, bs) * bs; q += bs) {
          const long long m = cdiv(len, q);
          if (q == std::max(min_p, cdiv(cdiv(len, m), bs) * bs)) ASSERT_LT(m, need) << where << " P " << P << " q " << q;
        }
      }

      // kAuto: the least worst-case regret of its candidates.
      ASSERT_EQ(p.reason, PlanReason::kLeastRegret) << where;
      ASSERT_TRUE(is_least_regret(p, resolved)) << where;
      if (p.kernel == V1) {
        ++v1_plans;
      } else {
        ++v2_plans;
        ASSERT_GE(p.partition_size, detail::planned_hi(resolved, p) <= 1024 ? bs : auto_min_p) << where;
        ASSERT_LE(p.partition_size, cdiv(p.band_hi, bs) * bs) << where;
      }
      // Where the model's arithmetic decides by itself: with every block resident at once
      // (per <= target) and enough of them to reach the roof (per >= roof_blocks), one block per
      // (sequence, KV head chunk) streams at the roof from its first tile, the least any launch can
      // do (pass 1 >= a block's fixed cost + bytes / roof). V1 does it with one kernel and no
      // partials, so below the threshold it wins at every length; above it, V2 with one partition
      // has the fewest partials and the shortest merge.
      if (per <= target && per >= roof_blocks()) {
        if (p.band_hi <= c.v2_threshold) {
          ++v1_by_arithmetic;
          ASSERT_EQ(p.kernel, V1) << where;
          ASSERT_EQ(p.predicted_regret, 0) << where;
        } else {
          ++one_part;
          ASSERT_EQ(p.max_partitions, 1) << where << " P " << p.partition_size;
        }
      }
      // Buckets that share a graph have identical launches; different graphs, different launches.
      ASSERT_GE(p.graph_id, 0) << where;
      const auto key = std::make_tuple(static_cast<int>(p.kernel), p.batch, p.partition_size, p.grid_x,
                                       p.launch_len);
      auto [it, fresh] = by_graph.emplace(p.graph_id, p);
      if (!fresh) {
        ++shared;
        const BucketPlan& g = it->second;
        ASSERT_EQ(g.kernel, p.kernel) << where;
        ASSERT_EQ(g.batch, p.batch) << where;
        ASSERT_EQ(g.partition_size, p.partition_size) << where;
        ASSERT_EQ(g.max_partitions, p.max_partitions) << where;
        ASSERT_EQ(std::make_tuple(g.grid_x, g.grid_y, g.grid_z), std::make_tuple(p.grid_x, p.grid_y, p.grid_z))
            << where;
        ASSERT_EQ(std::make_tuple(g.merge_grid_x, g.merge_grid_y, g.merge_grid_z),
                  std::make_tuple(p.merge_grid_x, p.merge_grid_y, p.merge_grid_z))
            << where;
        ASSERT_EQ(g.workspace_bytes, p.workspace_bytes) << where;
        ASSERT_EQ(g.launch_len, p.launch_len) << where;
      } else {
        ASSERT_TRUE(launches.insert(key).second) << where << ": a second graph for the same launch";
      }
    }
  }
  // The random cases covered every branch.
  EXPECT_GT(v1_plans, 100);
  EXPECT_GT(v2_plans, 100);
  EXPECT_GT(fill_v2, 100);
  EXPECT_GT(capped, 10);
  EXPECT_GT(shared, 100);
  EXPECT_GT(v1_by_arithmetic, 10);
  EXPECT_GT(one_part, 10);
}

// ---------------------------------------------------------------- graph sharing

int distinct_graphs(const std::vector<BucketPlan>& plans) {
  std::set<int> ids;
  for (const BucketPlan& p : plans) ids.insert(p.graph_id);
  return static_cast<int>(ids.size());
}

// Graphs a set of plans needs when V1 launches share one graph per batch bucket and V2 launches of
// different bands never do (their launch_len is their own band_hi): counted from the kernels alone.
int graphs_by_kernel(const std::vector<BucketPlan>& plans) {
  std::map<int, std::pair<int, bool>> per_batch;  // batch -> (V2 plans, any V1)
  for (const BucketPlan& p : plans) {
    auto& [v2, v1] = per_batch[p.batch];
    if (p.kernel == V2) ++v2;
    else v1 = true;
  }
  int n = 0;
  for (const auto& [batch, counts] : per_batch) n += counts.first + (counts.second ? 1 : 0);
  return n;
}

TEST(Plan, V1BandsOfABatchBucketShareOneGraph) {
  // The README's configuration: llama3-8b-like, max_batch 64, max_seq_len 131072: 11 buckets x 9
  // bands = 99 plans. kThreshold: per batch bucket the 5 bands up to 8192 are V1 with one launch
  // (sized for 8192), the 4 above are V2: 11 x (1 + 4) = 55 graphs.
  const AttentionSpec s = make_spec(32, 8);
  const auto thr = plan_buckets(plan_config(s, 64, 131072, KernelPolicy::kThreshold));
  const auto aut = plan_buckets(plan_config(s, 64, 131072, KernelPolicy::kAuto));
  EXPECT_EQ(thr.size(), 99u);
  EXPECT_EQ(distinct_graphs(thr), 55);
  for (const BucketPlan& p : thr)
    if (p.kernel == V1) {
      EXPECT_EQ(p.launch_len, 8192);
      EXPECT_EQ(p.graph_id, find_plan(thr, p.batch, 512).graph_id) << p.batch << " " << p.band_hi;
    }
  // kAuto: from batch 40 (40 x 8 = 320 blocks, at least the 266 that reach the model's roof, at most
  // the 660 slots) V1 wins every band up to the threshold by the model's arithmetic (see the
  // invariants test): buckets 40, 48, 56 and 64 each run their five V1 bands from one graph.
  for (int batch : {40, 48, 56, 64})
    for (int hi : {512, 1024, 2048, 4096, 8192}) {
      const BucketPlan& p = find_plan(aut, batch, hi);
      EXPECT_EQ(p.kernel, V1) << batch << " " << hi;
      EXPECT_EQ(p.graph_id, find_plan(aut, batch, 512).graph_id) << batch << " " << hi;
    }
  EXPECT_EQ(distinct_graphs(aut), graphs_by_kernel(aut));
  EXPECT_LE(distinct_graphs(aut), 99 - 4 * 4);
  // max_batch 256: 35 buckets x 9 bands = 315 plans. kThreshold: 35 x 5 = 175 graphs.
  const auto thr256 = plan_buckets(plan_config(s, 256, 131072, KernelPolicy::kThreshold));
  const auto aut256 = plan_buckets(plan_config(s, 256, 131072, KernelPolicy::kAuto));
  EXPECT_EQ(thr256.size(), 315u);
  EXPECT_EQ(distinct_graphs(thr256), 175);
  EXPECT_EQ(distinct_graphs(aut256), graphs_by_kernel(aut256));
}

// ---------------------------------------------------------------- the executor's plans

TEST(Plan, ExecutorPlansMatchPlanBucketsAndSizeTheWorkspace) {
  const AttentionSpec s = make_spec(4, 2, 64, 16, DType::kFloat32);
  World w(s, 1, 4, 16384);
  ExecutorConfig c = w.config(4, 16384);
  c.device_model = h200();
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  const auto& plans = ex.plans();
  ASSERT_EQ(plans.size(), ex.config().batch_buckets.size() * ex.config().band_edges.size());
  const std::vector<BucketPlan> expect = plan_buckets(c);
  ASSERT_EQ(plans.size(), expect.size());
  std::size_t largest = 0;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    EXPECT_EQ(plans[i].kernel, expect[i].kernel);
    EXPECT_EQ(plans[i].partition_size, expect[i].partition_size);
    EXPECT_EQ(plans[i].graph_id, expect[i].graph_id);
    largest = std::max(largest, plans[i].workspace_bytes);
  }
  EXPECT_EQ(ex.memory().workspace, largest);  // the largest plan sizes the workspace
  EXPECT_EQ(ex.stats().distinct_graphs, distinct_graphs(expect));
  EXPECT_EQ(ex.stats().buckets, static_cast<int>(plans.size()));
}

TEST(Plan, FixedPartitionSizeIsUsed) {
  const AttentionSpec s = make_spec(4, 2, 64, 16, DType::kFloat32);
  World w(s, 1, 2, 4096);
  ExecutorConfig c = w.config(2, 4096);
  c.v2_threshold = 1024;
  c.partition_size = 512;
  Executor ex(c);
  int v2 = 0;
  for (const BucketPlan& p : ex.plans())
    if (p.kernel == V2) {
      EXPECT_EQ(p.partition_size, 512);
      ++v2;
    }
  EXPECT_GT(v2, 0);
}

TEST(Plan, DeviceModelDefaultsToTheHostModelAndKeepsGivenFields) {
  const AttentionSpec s = make_spec(32, 8, 128, 16, DType::kBFloat16);
  World w(s, 1, 2, 1024);
  ExecutorConfig c = w.config(2, 1024);
  Executor ex(c);  // host backend: an H200 with the current kernel's occupancy
  EXPECT_EQ(ex.config().device_model.num_sms, 132);
  EXPECT_EQ(ex.config().device_model.blocks_per_sm, kernels::blocks_per_sm(kernels::pass1_resources(s)));
  EXPECT_GE(ex.config().device_model.blocks_per_sm, 1);
  c.device_model.num_sms = 16;
  c.device_model.blocks_per_sm = 3;
  Executor given(c);
  EXPECT_EQ(given.config().device_model.num_sms, 16);
  EXPECT_EQ(given.config().device_model.blocks_per_sm, 3);
  EXPECT_EQ(given.plans().front().target_blocks, 48);
  c.device_model.num_sms = 0;  // one field given, the other modelled
  Executor half(c);
  EXPECT_EQ(half.config().device_model.num_sms, 132);
  EXPECT_EQ(half.config().device_model.blocks_per_sm, 3);
}

TEST(Plan, TableShowsThePredictionsAndWhy) {
  const AttentionSpec s = make_spec(32, 32);
  const auto plans = plan_buckets(plan_config(s, 64, 16384, KernelPolicy::kAuto));
  const std::string table = format_plan_table(plans);
  for (const char* col : {"kernel", "blocks", "target", "live@lo", "waves", "pred us", "loop/fixed/merge/launch", "roof% lo/mid/hi", "graph", "why"})
    EXPECT_NE(table.find(col), std::string::npos) << col << "\n" << table;
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), static_cast<long>(plans.size()) + 1);
  // kAuto says it chose by predicted time, with the regret, the candidates and the three times.
  for (const BucketPlan& p : plans) {
    // The lengths: lower edge + 1 (the first band: half its upper edge), middle, upper edge.
    EXPECT_EQ(p.predicted_lo.len, p.band == 0 ? p.band_hi / 2 : p.band_lo + 1);
    char want[256];
    std::snprintf(want, sizeof want,
                  "predicted time: least worst-case regret (%+.1f %%) of %d candidates; %.1f / %.1f / %.1f us at "
                  "%d / %d / %d tokens",
                  100 * p.predicted_regret, p.candidates_scored, p.predicted_lo.us, p.predicted_mid.us,
                  p.predicted_hi.us, p.predicted_lo.len, p.predicted_mid.len, p.band_hi);
    EXPECT_EQ(describe_reason(p), want);
    EXPECT_NE(table.find(want), std::string::npos) << want;
  }
  // kThreshold says it follows the plain rule.
  const auto thr = plan_buckets(plan_config(s, 64, 16384, KernelPolicy::kThreshold));
  EXPECT_EQ(describe_reason(find_plan(thr, 64, 1024)), "threshold rule: V1 up to the threshold");
  EXPECT_EQ(describe_reason(find_plan(thr, 64, 16384)),
            "threshold rule: V2 above the threshold, P fills 660 slots at 8192 tokens");
  // The merge grid has a slice per 32 head elements: head 128 -> 4.
  const BucketPlan& v2 = find_plan(thr, 64, 16384);
  EXPECT_EQ(std::make_tuple(v2.merge_grid_x, v2.merge_grid_y, v2.merge_grid_z), std::make_tuple(32 * 64, 1, 4));
  EXPECT_NE(format_plan_table({v2}).find("2048,1,4"), std::string::npos);
}

// ---------------------------------------------------------------- plan lookup: index or size

template <typename... Args>
concept PlanForAccepts = requires(const Executor& ex, Args... args) { ex.plan_for(args...); };
// A bare int is neither a bucket index nor a step: passing StepResult::bucket_batch_size (a size)
// where an index is wanted does not compile.
static_assert(!PlanForAccepts<int, int>);
static_assert(PlanForAccepts<BucketIndex, int>);
static_assert(PlanForAccepts<StepResult>);
static_assert(!std::is_convertible_v<int, BucketIndex>);

TEST(Plan, LookupByIndexBySizeAndByStepAgree) {
  const AttentionSpec s = make_spec(4, 2, 64, 16, DType::kFloat32);
  World w(s, 1, 8, 2048);
  ExecutorConfig c = w.config(8, 2048);  // buckets 1 2 4 8; bands 512 1024 2048
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  // The trap the old API had: after a batch-2 step, bucket "2" as an index is the batch-4 bucket.
  w.set_lens({100, 700});
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());
  EXPECT_EQ(r.bucket_batch_size, 2);
  EXPECT_EQ(r.bucket, BucketIndex(1));
  EXPECT_EQ(ex.plan_for(r).batch, 2);
  EXPECT_EQ(ex.plan_for(r).band, 1);
  EXPECT_EQ(ex.plan_for(r).graph_id, r.graph_id);
  EXPECT_EQ(ex.plan_for(BucketIndex(2), 1).batch, 4);
  EXPECT_EQ(ex.plan_for_batch(2, 1).batch, 2);
  EXPECT_EQ(ex.plan_for_batch(3, 1).batch, 4);  // a size rounds up to its bucket
  EXPECT_EQ(&ex.plan_for_batch(8, 2), &ex.plan_for(BucketIndex(3), 2));
  try {
    ex.plan_for(BucketIndex(8), 0);  // a batch size passed as an index
    ADD_FAILURE() << "no Error for bucket index 8";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bucket = 8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("0..3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a batch size"), std::string::npos) << msg;
  }
  EXPECT_THROW(ex.plan_for_batch(0, 0), Error);
  EXPECT_THROW(ex.plan_for_batch(9, 0), Error);
  EXPECT_THROW(ex.plan_for(BucketIndex(0), 3), Error);
}

}  // namespace
