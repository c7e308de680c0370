// Speculative decoding in the executor (issue 18) on the host backend: steps of q_len = 1 + k query
// tokens per sequence (ExecutorConfig::q_lens, StepInputs::q_len). A verify loop that drafts k = 3
// and accepts 0..3 drafts per step, checked every step against the float64 reference and the
// appended slots bitwise, across 8192; graphs replayed after the lengths change; the bad input; the
// plans per q_len.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"
#include "executor/cost_model.hpp"
#include "executor/gqa_plan.hpp"
#include "executor/plan.hpp"
#include "kernels/occupancy.hpp"

namespace {
using namespace decodegraph;
using dgtest::rejects;
using dgtest::small_spec;
using dgtest::World;

constexpr int kDrafts = 3;  // EAGLE k = 3: q_lens {1, 4}

class VerifyLoop : public ::testing::TestWithParam<BandSelect> {};

// Seven sequences (a padded bucket of 8): short ones from q_len on, and two that cross 8192, so
// that their band moves from V1's to V2's above the threshold mid-loop. Each step drafts k = 3
// (n = 4) or, at random, none (n = 1); after it 0..n-1 drafts are accepted, so a sequence's
// committed length grows by 1..4 and the next step writes over its rejected drafts' slots.
TEST_P(VerifyLoop, EveryStepMatchesTheReferenceAndAppendsEveryToken) {
  World w(small_spec(), 2, 7, 8704, 18);
  ExecutorConfig c = w.config(8, 8704);  // kFull: every slot checked at its own position first
  c.q_lens = {1, kDrafts + 1};
  c.band_select = GetParam();
  Executor ex(c);
  std::vector<int> committed = {0, 1, 15, 16, 127, 8150, 8187};  // tokens verified so far
  std::mt19937 rng(1818);
  int steps_n1 = 0, steps_n4 = 0, above_threshold = 0;
  for (int step = 0; step < 14; ++step) {
    const int n = step == 3 || rng() % 4 == 0 ? 1 : kDrafts + 1;
    std::vector<int> lens;
    for (int c0 : committed) lens.push_back(c0 + n);  // the last verified token + the drafts
    w.set_lens(lens, n);
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    ASSERT_EQ(r.q_len, n);
    ASSERT_EQ(ex.plan_for(r).q_len, n);
    for (int l = 0; l < w.num_layers; ++l) {
      ASSERT_TRUE(w.check_layer(ex, l)) << "step " << step << " n " << n << " layer " << l;
      ASSERT_TRUE(w.check_appended(ex, l)) << "step " << step << " n " << n << " layer " << l;
    }
    (n == 1 ? steps_n1 : steps_n4) += 1;
    above_threshold += r.band_hi > 8192;
    for (int& c0 : committed) c0 += 1 + (n == 1 ? 0 : static_cast<int>(rng() % n));
  }
  EXPECT_GT(steps_n1, 0);
  EXPECT_GT(steps_n4, 0);
  EXPECT_GT(above_threshold, 0) << "the loop must cross 8192";
  EXPECT_LT(above_threshold, 14) << "the loop must start below 8192";
  EXPECT_EQ(ex.stats().rejected_steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Bands, VerifyLoop, ::testing::Values(BandSelect::kHost, BandSelect::kDevice),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// A graph captured for one step is replayed, unchanged, for the next steps whose lengths differ
// (kHost: the same band; kDevice: every band, the graph picks it), and each q_len has its own.
class QLenReplay : public ::testing::TestWithParam<BandSelect> {};

TEST_P(QLenReplay, AGraphReplayedAfterTheLengthsChangeMatchesTheReference) {
  World w(small_spec(DType::kBFloat16), 1, 5, 2048, 77);
  ExecutorConfig c = w.config(8, 2048);
  c.validation = ValidationLevel::kCheap;
  c.q_lens = {1, 4};
  c.band_select = GetParam();
  Executor ex(c);
  const bool device = GetParam() == BandSelect::kDevice;
  // Lengths within the band (256, 512] for kHost; kDevice moves across bands with one graph.
  const std::vector<std::vector<int>> steps = {{300, 257, 511, 400, 4}, {301, 260, 512, 404, 8},
                                               device ? std::vector<int>{1500, 4, 17, 1029, 64}
                                                      : std::vector<int>{420, 16, 33, 490, 5}};
  int graph4 = -1;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    w.set_lens(steps[s], 4);
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    EXPECT_EQ(r.captured, s == 0) << "step " << s;
    if (s == 0) graph4 = r.graph_id;
    EXPECT_EQ(r.graph_id, graph4) << "step " << s;
    EXPECT_TRUE(w.check_layer(ex, 0)) << "step " << s;
    EXPECT_TRUE(w.check_appended(ex, 0)) << "step " << s;
  }
  // n = 1 in the same bucket: another graph, whose rows are one per sequence.
  w.set_lens({301, 260, 500, 404, 9});
  w.fill_step(ex);
  const StepResult r1 = ex.step(w.inputs());
  EXPECT_TRUE(r1.captured);
  EXPECT_NE(r1.graph_id, graph4);
  EXPECT_TRUE(w.check_layer(ex, 0));
  const ExecutorStats st = ex.stats();
  ASSERT_EQ(st.graphs.size(), 2u);
  for (const GraphStats& g : st.graphs) {
    EXPECT_EQ(g.captures, 1);
    EXPECT_EQ(g.replays, g.graph_id == graph4 ? 3 : 1);
    EXPECT_EQ(g.q_len, g.graph_id == graph4 ? 4 : 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Bands, QLenReplay, ::testing::Values(BandSelect::kHost, BandSelect::kDevice),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// kMeasured measures a (q_len, batch bucket, band) when a step of that q_len first needs it (the
// clock sees the plan's q_len), and rebind_layers re-captures every q_len's graphs.
TEST(QLenGraphs, MeasuredPerQLenAndRebindReCapturesEveryQLen) {
  World w(small_spec(), 1, 3, 4096, 91);
  ExecutorConfig c = w.config(4, 4096);
  c.q_lens = {1, 4};
  c.policy = KernelPolicy::kMeasured;
  c.band_select = BandSelect::kHost;
  std::vector<int> clock_q_lens;
  c.measure_clock = [&](const BucketPlan& b, const PlanCandidate& k) {
    clock_q_lens.push_back(b.q_len);
    return k.kernel == KernelKind::kV1 ? 5.0 : 9.0;  // V1 fastest
  };
  Executor ex(c);
  w.set_lens({3000, 4000, 2500}, 4);
  w.fill_step(ex);
  const StepResult r4 = ex.step(w.inputs());
  EXPECT_TRUE(r4.measured);
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_appended(ex, 0));
  ASSERT_FALSE(clock_q_lens.empty());
  EXPECT_TRUE(std::all_of(clock_q_lens.begin(), clock_q_lens.end(), [](int q) { return q == 4; }));
  EXPECT_EQ(ex.plan_for(r4).reason, PlanReason::kMeasuredFastest);
  EXPECT_EQ(ex.plan_for(r4).kernel, KernelKind::kV1);
  EXPECT_EQ(ex.plan_for(0, r4.bucket, r4.band, 1).reason, PlanReason::kNotMeasured);
  const std::size_t measured4 = clock_q_lens.size();
  w.set_lens({3001, 4001, 2501}, 1);
  w.fill_step(ex);
  const StepResult r1 = ex.step(w.inputs());
  EXPECT_TRUE(r1.measured);
  EXPECT_EQ(clock_q_lens.back(), 1);
  EXPECT_GT(clock_q_lens.size(), measured4);
  EXPECT_NE(r1.graph_id, r4.graph_id);
  EXPECT_TRUE(w.check_layer(ex, 0));

  // New caches holding the same contents; the old ones then get other data, which no graph may read.
  std::vector<dgtest::Buffer> k2 = w.k, v2 = w.v;
  ExecutorConfig moved = c;
  moved.layers[0].k_cache = k2[0].data();
  moved.layers[0].v_cache = v2[0].data();
  ex.rebind_layers(moved.layers);
  std::swap(w.k, k2);
  std::swap(w.v, v2);
  dgtest::fill_uniform(w.spec.dtype, k2[0].data(), k2[0].bytes / dtype_size(w.spec.dtype), w.rng);
  dgtest::fill_uniform(w.spec.dtype, v2[0].data(), v2[0].bytes / dtype_size(w.spec.dtype), w.rng);
  EXPECT_EQ(ex.stats().graph_updates, 2);
  for (int n : {4, 1}) {
    w.set_lens({3002, 4002, 2502}, n);
    w.fill_step(ex);
    EXPECT_FALSE(ex.step(w.inputs()).captured);
    EXPECT_TRUE(w.check_layer(ex, 0)) << "n " << n;
    EXPECT_TRUE(w.check_appended(ex, 0)) << "n " << n;
  }
}

// ---------------------------------------------------------------- bad input

ExecutorConfig qlen_config(World& w, std::vector<int> q_lens) {
  ExecutorConfig c = w.config(4, 1024);
  c.q_lens = std::move(q_lens);
  return c;
}

TEST(QLenConfig, QLensOutsideTheirRangeOrRepeatedAreRejected) {
  World w(small_spec(), 1, 4, 1024, 5);
  EXPECT_TRUE(rejects([&] { Executor ex(qlen_config(w, {})); }, {"q_lens", "empty", "1..kMaxQLen = 1..16"}));
  EXPECT_TRUE(rejects([&] { Executor ex(qlen_config(w, {1, 0})); }, {"q_lens[1] = 0", "1..kMaxQLen = 1..16"}));
  EXPECT_TRUE(rejects([&] { Executor ex(qlen_config(w, {17})); }, {"q_lens[0] = 17", "1..kMaxQLen = 1..16"}));
  EXPECT_TRUE(rejects([&] { Executor ex(qlen_config(w, {4, 1, 4})); }, {"q_lens = [4, 1, 4]", "distinct", "4 appears"}));
  ExecutorConfig tiny = qlen_config(w, {1, 8});
  tiny.max_seq_len = 5;
  tiny.band_edges = {5};
  EXPECT_TRUE(rejects([&] { Executor ex(tiny); }, {"q_lens[1] = 8", "max_seq_len = 5"}));
  EXPECT_TRUE(rejects([&] { plan_buckets(qlen_config(w, {2, 2})); }, {"q_lens = [2, 2]", "distinct"}));
  // Accepted in any order; config() lists them ascending.
  Executor ex(qlen_config(w, {8, 1, 3}));
  EXPECT_EQ(ex.config().q_lens, (std::vector<int>{1, 3, 8}));
}

// Each rejected step changes nothing: the next valid step (of either q_len) is correct.
TEST(QLenBadInput, EachBadStepIsAClearErrorAndTheExecutorStaysUsable) {
  World w(small_spec(), 2, 4, 1024, 31);
  Executor ex(qlen_config(w, {1, 4}));  // kFull
  auto valid_step = [&](int n) {
    w.set_lens({40, 4, 700, 129}, n);
    w.fill_step(ex);
    ex.step(w.inputs());
    for (int l = 0; l < w.num_layers; ++l) {
      EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l;
      EXPECT_TRUE(w.check_appended(ex, l)) << "layer " << l;
    }
  };

  // n outside the captured set.
  w.set_lens({40, 4, 700, 129}, 2);
  w.fill_step(ex);
  EXPECT_TRUE(rejects([&] { ex.step(w.inputs()); }, {"inputs.q_len = 2", "one of config().q_lens = [1, 4]"}));
  valid_step(4);
  StepInputs zero = w.inputs();
  zero.q_len = 0;
  EXPECT_TRUE(rejects([&] { ex.step(zero); }, {"inputs.q_len = 0", "[1, 4]"}));
  valid_step(1);

  // n > L: a sequence with fewer tokens than the step's query rows.
  w.set_lens({40, 3, 700, 129}, 1);
  StepInputs short_seq = w.inputs();
  short_seq.q_len = 4;
  std::vector<int64_t> wide(16, -1);  // a [4, 4] slot mapping, so only the length is wrong
  short_seq.slot_mapping = wide.data();
  EXPECT_TRUE(rejects([&] { ex.step(short_seq); },
                      {"inputs.seq_lens[1] = 3", "q_len..max_seq_len = 4..1024", "q_len new tokens"}));
  valid_step(4);

  // A slot mapping of the wrong width: [num_seqs] entries (q_len 1's layout) for a q_len 4 step.
  // Its width is not visible from a pointer; kFull finds entry 0 at the wrong position (the
  // caller's buffer here holds [4, 4] entries, the last 12 of them the skip value).
  w.set_lens({40, 4, 700, 129}, 1);
  std::vector<int64_t> narrow(16, -1);
  std::copy(w.slots.begin(), w.slots.end(), narrow.begin());
  StepInputs narrow_in = w.inputs();
  narrow_in.q_len = 4;
  narrow_in.slot_mapping = narrow.data();
  EXPECT_TRUE(rejects([&] { ex.step(narrow_in); },
                      {"inputs.slot_mapping[0] (sequence 0, token 0 of q_len 4: position seq_len - q_len + 0 = 36)",
                       "= " + std::to_string(narrow[0])}));
  // Token j of sequence i at position L - 4 + j + 1 instead of L - 4 + j (one off).
  w.set_lens({40, 4, 700, 129}, 4);
  std::vector<int64_t> shifted = w.slots;
  shifted[9] = w.slot_of(2, 700 - 4 + 1 + 1);
  StepInputs shifted_in = w.inputs();
  shifted_in.slot_mapping = shifted.data();
  EXPECT_TRUE(rejects([&] { ex.step(shifted_in); },
                      {"inputs.slot_mapping[9] (sequence 2, token 1 of q_len 4: position seq_len - q_len + 1 = 697)",
                       "= " + std::to_string(w.slots[9]), "the slot of position seq_len - q_len + 1 = 697",
                       "seq_lens counts every token appended this step"}));
  valid_step(4);
  valid_step(1);
  EXPECT_EQ(ex.stats().rejected_steps, 5);

  // Plans of a q_len that is not captured.
  EXPECT_TRUE(rejects([&] { ex.plan_for(0, BucketIndex(0), 0, 2); }, {"q_len = 2", "[1, 4]"}));
  EXPECT_TRUE(rejects([&] { ex.plan_for_batch(3, 0, 5); }, {"q_len = 5", "[1, 4]"}));
}

// kCheap: a token whose slot is past the cache is skipped and reported, and the other tokens of the
// step are appended; the host staging buffers hold a [max_batch, max q_len] slot mapping.
TEST(QLenBadInput, KCheapSkipsASlotPastTheCacheAndStagesTheWholeSlotMapping) {
  World w(small_spec(), 1, 4, 1024, 32);
  ExecutorConfig c = qlen_config(w, {1, 4});
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  HostStaging h = ex.host_staging();
  ASSERT_EQ(h.slot_mapping.size(), 4u * 4u);
  w.set_lens({40, 4, 700, 129}, 4);
  std::copy(w.lens.begin(), w.lens.end(), h.seq_lens.begin());
  for (std::size_t i = 0; i < w.lens.size(); ++i)
    std::copy_n(w.tables.begin() + i * w.stride, w.stride, h.block_tables.begin() + i * h.block_table_stride);
  std::copy(w.slots.begin(), w.slots.end(), h.slot_mapping.begin());
  StepInputs in = w.inputs();
  in.seq_lens = h.seq_lens.data();
  in.block_tables = h.block_tables.data();
  in.block_table_stride = h.block_table_stride;
  in.slot_mapping = h.slot_mapping.data();
  w.fill_step(ex);
  ex.step(in);
  EXPECT_EQ(ex.stats().staging_copy_bytes, 0);  // written in place: nothing copied
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_appended(ex, 0));

  w.slots[14] = static_cast<int64_t>(w.num_blocks) * 16 + 3;  // sequence 3, token 2: past the cache
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(rejects([&] { ex.check_errors(); },
                      {"slot_past_cache, sequence 3",
                       "inputs.slot_mapping[14] (sequence 3, token 2 of q_len 4: position seq_len - q_len + 2 = "
                       "seq_len - 2) was at or past"}));
  w.slots[14] = -1;  // the skipped token: not in the cache, the others are
  EXPECT_TRUE(w.check_appended(ex, 0));
  w.set_lens({41, 5, 701, 130}, 4);
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_appended(ex, 0));
}

// ---------------------------------------------------------------- plans

ExecutorConfig plan_config(std::vector<int> q_lens) {
  ExecutorConfig c;
  c.spec = small_spec(DType::kBFloat16);
  c.spec.num_q_heads = 32;
  c.spec.num_kv_heads = 8;
  c.spec.head_size = 128;
  c.max_batch = 16;
  c.max_seq_len = 32768;
  c.q_lens = std::move(q_lens);
  return c;
}

// Plans per (q_len, batch bucket, band): q_len 1's are those of a config without drafts (the same
// table, byte for byte), q_len 4's size their V2 partials for 4 rows per sequence and share no
// launch with q_len 1's, and the table shows n.
TEST(QLenPlans, PlansArePerQLenAndQLenOnesAreUnchanged) {
  const std::vector<BucketPlan> one = plan_buckets(plan_config({1}));
  const std::vector<BucketPlan> both = plan_buckets(plan_config({4, 1}));
  ASSERT_EQ(both.size(), 2 * one.size());
  const std::vector<BucketPlan> first(both.begin(), both.begin() + static_cast<std::ptrdiff_t>(one.size()));
  EXPECT_EQ(format_plan_table(first), format_plan_table(one));
  EXPECT_EQ(format_plan_table(one).find(" n "), std::string::npos);
  const std::string table = format_plan_table(both);
  EXPECT_EQ(table.rfind(" n  batch", 0), 0u) << table.substr(0, 200);
  int max_id_q1 = -1;
  for (const BucketPlan& p : first) {
    EXPECT_EQ(p.q_len, 1);
    max_id_q1 = std::max(max_id_q1, p.graph_id);
  }
  const AttentionSpec spec = plan_config({1}).spec;
  int v2 = 0;
  for (std::size_t i = one.size(); i < both.size(); ++i) {
    const BucketPlan& p = both[i];
    EXPECT_EQ(p.q_len, 4);
    EXPECT_GT(p.graph_id, max_id_q1) << "a q_len 4 plan shares a launch with q_len 1";
    if (p.kernel != KernelKind::kV2) continue;
    ++v2;
    EXPECT_EQ(p.workspace_bytes, v2_workspace_size(spec, p.batch, p.band_hi, p.partition_size, 4));
    EXPECT_EQ(p.merge_grid_x, p.batch * 4 * spec.num_q_heads);  // rows x heads (kernels/merge_partitions.cuh)
  }
  EXPECT_GT(v2, 0);
}

// The cost model reads the KV once for all n rows: n = 4 adds only q, out and partials bytes.
TEST(QLenPlans, TheCostModelCountsTheKvOnceAndQAndOutPerRow) {
  ExecutorConfig c = detail::resolve_planning(plan_config({1, 4}));
  c.device_model = host_device_model(c.spec);
  BucketPlan p;
  p.batch = 8;
  p.band_lo = 0;
  p.band_hi = 4096;
  p.design_len = 2048;
  const int len = 3000;
  const double row_bytes = 32.0 * 128 * 2;  // one query row of bf16: 32 heads x 128
  for (KernelKind k : {KernelKind::kV1, KernelKind::kV2}) {
    BucketPlan a = p, b = p;
    b.q_len = 4;
    detail::set_launch(a, c, k, k == KernelKind::kV2 ? 512 : 0);
    detail::set_launch(b, c, k, k == KernelKind::kV2 ? 512 : 0);
    const detail::CostBreakdown x = detail::predict_call(c, a, len), y = detail::predict_call(c, b, len);
    // q and out: 2 x 3 more rows per sequence; V2 partials: 3 more rows' (head_size + 2) fp32 per
    // head and partition, written and read.
    double extra = 8 * 2 * 3 * row_bytes;
    if (k == KernelKind::kV2) extra += 2.0 * 8 * 3 * 32 * (128 + 2) * 4 * num_partitions(len, 512);
    EXPECT_NEAR(y.bytes - x.bytes, extra, 1e-6 * x.bytes) << to_string(k);
    EXPECT_GE(y.us, x.us) << to_string(k);
  }
}

// GQA 8 x q_len 4 is 32 rows a KV head: two head chunks, each streaming the KV again (issue 39,
// item 5). The plans count those blocks, their grid y is the launch's, and the cost model's pass
// 1 pays for them; the planner's q_len 1 counts (one chunk) under-counted them.
TEST(QLenPlans, RowsPast16SplitIntoHeadChunksThePlansCount) {
  ExecutorConfig c = detail::resolve_planning(plan_config({1, 4}));
  c.device_model = host_device_model(c.spec);
  ASSERT_EQ(c.spec.num_q_heads / c.spec.num_kv_heads, 4);
  c.spec.num_q_heads = 64;  // GQA 8
  c.device_model = host_device_model(c.spec);
  EXPECT_EQ(kernels::pass1_head_chunks(c.spec, 1), 1);
  EXPECT_EQ(kernels::pass1_head_chunks(c.spec, 4), 2);
  BucketPlan p;
  p.batch = 2;
  p.band_lo = 8192;
  p.band_hi = 32768;
  p.design_len = 16384;
  BucketPlan one = p, four = p;
  four.q_len = 4;
  detail::set_launch(one, c, KernelKind::kV2, 1024);
  detail::set_launch(four, c, KernelKind::kV2, 1024);
  EXPECT_EQ(one.grid_y, 8);
  EXPECT_EQ(four.grid_y, 16);  // what launch_paged_decode's grid y is
  EXPECT_EQ(four.blocks, 2 * one.blocks);
  // Twice the blocks streaming the same bytes per block: pass 1 at 32K takes about twice as long.
  const detail::CostBreakdown x = detail::predict_call(c, one, 32768), y = detail::predict_call(c, four, 32768);
  EXPECT_GT(y.pass1_us, 1.5 * x.pass1_us);
}

// fp16 GQA 2 runs on the CUDA cores at q_len 1 (2 rows) and on tensor cores at q_len 4 (8 rows):
// its plans count the resident blocks of the kernel that runs, not q_len 1's (issue 39, item 5).
TEST(QLenPlans, TheSlotsAreThoseOfTheKernelTheRowsSelect) {
  ExecutorConfig c = detail::resolve_planning(plan_config({1, 4}));
  c.spec.dtype = DType::kFloat16;
  c.spec.layout = KVLayout::kVLLM;  // its tensor-core kernel fits 5 blocks an SM, the CUDA-core one 6
  c.spec.num_q_heads = 16;  // GQA 2
  c.device_model = host_device_model(c.spec);
  const kernels::KernelResources cuda_cores = kernels::pass1_resources(c.spec, 1);
  const kernels::KernelResources tensor_cores = kernels::pass1_resources(c.spec, 4);
  EXPECT_EQ(cuda_cores.threads, 128);
  EXPECT_EQ(tensor_cores.threads, 128);
  ASSERT_NE(kernels::blocks_per_sm(cuda_cores), kernels::blocks_per_sm(tensor_cores))
      << "the test needs the two kernels to differ in occupancy";
  EXPECT_EQ(detail::pass1_slots(c, 1), c.device_model.target_blocks());
  EXPECT_EQ(detail::pass1_slots(c, 4), 132LL * kernels::blocks_per_sm(tensor_cores));
  BucketPlan p;
  p.batch = 1;
  p.band_lo = 8192;
  p.band_hi = 32768;
  p.design_len = 16384;
  p.q_len = 4;
  detail::set_launch(p, c, KernelKind::kV2, 1024);
  EXPECT_EQ(p.target_blocks, 132 * kernels::blocks_per_sm(tensor_cores));
}

}  // namespace
