// Executor tests through the host backend (run everywhere): each op eager / captured+replayed /
// replayed after lengths and batch changed, all against the float64 reference; the V1 -> V2 swap at
// 8192; every policy across the threshold; kMeasured's choice, its cost and its safety; graphs shared
// by buckets; bucket edges; padding; lazy vs up-front capture; KV append; recovery after a rejected
// step and after an exception inside the step body; a multi-layer step body with caller work; graph
// semantics (a pointer changed after capture is not seen); the fault seam; memory accounting.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "exec_world.hpp"
#include "executor/backend.hpp"

namespace {
using namespace decodegraph;
using dgtest::World;

using dgtest::small_spec;

std::vector<int> random_lens(std::mt19937_64& rng, int n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int> v(n);
  for (int& x : v) x = d(rng);
  return v;
}

bool all_nan_rows(const AttentionSpec& s, const void* out, int from, int to) {
  const std::size_t row = static_cast<std::size_t>(s.num_q_heads) * s.head_size;
  for (std::size_t i = from * row; i < to * row; ++i)
    if (!std::isnan(load_as_float(s.dtype, out, i))) {
      ADD_FAILURE() << "padded row " << i / row << " element " << i % row << " = " << load_as_float(s.dtype, out, i);
      return false;
    }
  return true;
}

// ---------------------------------------------------------------- each op three ways

using ThreeWayParam = std::tuple<DType, KVLayout, KernelKind>;
class ThreeWays : public ::testing::TestWithParam<ThreeWayParam> {};

TEST_P(ThreeWays, EagerCapturedAndReplayedAfterChangesMatchReference) {
  const auto [dtype, layout, kind] = GetParam();
  const AttentionSpec s = small_spec(dtype, layout);
  const int max_len = 2048;
  World w(s, 1, 24, max_len, 11);
  // V1 bands: lengths <= 512; V2 bands: (512, 2048], several partitions of 256.
  const int lo = kind == KernelKind::kV1 ? 1 : 513;
  const int hi = kind == KernelKind::kV1 ? 512 : max_len;
  const dgtest::Tol t = dgtest::tol_for(dtype);

  // 1. eager: the host implementation on the caller's buffers.
  {
    w.set_lens(random_lens(w.rng, 5, lo, hi));
    const int n = 5;
    dgtest::Buffer q = dgtest::make_buffer(dtype, w.q_elems(n)), out = dgtest::make_buffer(dtype, w.q_elems(n));
    dgtest::fill_uniform(dtype, q.data(), w.q_elems(n), w.rng);
    DecodeArgs a;
    a.spec = s;
    a.num_seqs = n;
    a.max_seq_len = hi;
    a.block_table_stride = w.stride;
    a.num_blocks = w.num_blocks;
    a.q = q.data();
    a.out = out.data();
    a.k_cache = w.k[0].data();
    a.v_cache = w.v[0].data();
    a.block_tables = w.tables.data();
    a.seq_lens = w.lens.data();
    if (kind == KernelKind::kV1) {
      host::paged_attention_v1(a);
    } else {
      const std::size_t ws = v2_workspace_size(s, n, hi, 256);
      std::vector<char> work(ws + 256);
      host::paged_attention_v2(a, 256, work.data(), ws);
    }
    const std::vector<double> ref = w.reference(0, q.data());
    EXPECT_TRUE(dgtest::check_close(dtype, out.data(), ref.data(), n, s.num_q_heads, s.head_size, t.atol, t.rtol));
  }

  ExecutorConfig c = w.config(24, max_len);
  c.v2_threshold = 512;
  c.partition_size = 256;
  c.policy = KernelPolicy::kThreshold;  // V1 up to 512 whatever the batch
  Executor ex(c);

  // 2. captured, then replayed; 3. replayed after lengths and batch changed (same bucket), then a
  // new bucket. KV append runs in every step and is checked too.
  const std::vector<int> batches = {5, 7, 6, 3, 8};
  for (std::size_t k = 0; k < batches.size(); ++k) {
    w.set_lens(random_lens(w.rng, batches[k], lo, hi));
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    EXPECT_EQ(r.kernel, kind);
    EXPECT_EQ(r.captured, k == 0 || k == 3) << "step " << k;
    EXPECT_TRUE(w.check_appended(ex, 0)) << "step " << k;
    EXPECT_TRUE(w.check_layer(ex, 0)) << "step " << k << " batch " << batches[k];
  }
  EXPECT_EQ(ex.stats().total_captures, 2);
  EXPECT_EQ(ex.stats().replays(kind), 5);
}

INSTANTIATE_TEST_SUITE_P(
    Host, ThreeWays,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                       ::testing::Values(KVLayout::kVLLM, KVLayout::kNHD),
                       ::testing::Values(KernelKind::kV1, KernelKind::kV2)),
    [](const auto& info) {
      return std::string(to_string(std::get<0>(info.param))) + "_" + to_string(std::get<1>(info.param)) + "_" +
             to_string(std::get<2>(info.param));
    });

// ---------------------------------------------------------------- the V1 -> V2 swap at 8192

TEST(ExecutorHost, GrowingFrom8000To8400ReplaysV1UpTo8192ThenV2) {
  AttentionSpec s = small_spec();
  s.num_q_heads = 2;
  s.num_kv_heads = 1;
  const int max_len = 8448;
  World w(s, 1, 2, max_len, 3);
  ExecutorConfig c = w.config(2, max_len);  // default bands: ..., 4096, 8192, 8448; threshold 8192
  c.policy = KernelPolicy::kThreshold;
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  ASSERT_EQ(ex.config().band_edges.back(), 8448);
  long long v1 = 0, v2 = 0;
  for (int len = 8000; len <= 8400; ++len) {
    w.set_lens({len, len - 37});
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    const KernelKind want = len <= 8192 ? KernelKind::kV1 : KernelKind::kV2;
    ASSERT_EQ(r.kernel, want) << "len " << len;
    ASSERT_EQ(r.band_hi, len <= 8192 ? 8192 : 8448) << "len " << len;
    (want == KernelKind::kV1 ? v1 : v2) += 1;
    ASSERT_TRUE(w.check_layer(ex, 0)) << "len " << len;
  }
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(v1, 193);  // 8000..8192
  EXPECT_EQ(v2, 208);  // 8193..8400
  EXPECT_EQ(st.replays(KernelKind::kV1), 193);
  EXPECT_EQ(st.replays(KernelKind::kV2), 208);
  EXPECT_EQ(st.total_captures, 2);
  ASSERT_EQ(st.graphs.size(), 2u);
  for (const GraphStats& g : st.graphs) EXPECT_EQ(g.captures, 1);
  EXPECT_EQ(st.steps, 401);
}

// ---------------------------------------------------------------- every policy across the threshold

using PolicyParam = std::tuple<KernelPolicy, int>;  // policy, batch
class PolicyAcrossThreshold : public ::testing::TestWithParam<PolicyParam> {};

// Lengths 8191, 8192 and 8193 (the longest sequence of each step; the others random below it) at
// batches 1, 7 and 17, one executor per policy, every step against the float64 reference.
TEST_P(PolicyAcrossThreshold, MatchesTheReference) {
  const auto [policy, batch] = GetParam();
  AttentionSpec s = small_spec(DType::kBFloat16);
  const int max_len = 8448;
  World w(s, 1, 17, max_len, 53 + batch);
  ExecutorConfig c = w.config(17, max_len);  // bands ..., 4096, 8192, 8448; buckets 1 2 4 8 16 17
  c.policy = policy;
  c.measure_replays = 1;  // the host replays are CPU attention: keep kMeasured's timing short
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  for (int len : {8191, 8192, 8193}) {
    std::vector<int> lens = random_lens(w.rng, batch, 1, len);
    lens[batch / 2] = len;
    w.set_lens(lens);
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    EXPECT_EQ(r.band_hi, len <= 8192 ? 8192 : 8448);
    if (len > 8192) EXPECT_EQ(r.kernel, KernelKind::kV2) << "above the threshold every policy runs V2";
    if (policy == KernelPolicy::kThreshold) EXPECT_EQ(r.kernel, len <= 8192 ? KernelKind::kV1 : KernelKind::kV2);
    EXPECT_EQ(r.measured, policy == KernelPolicy::kMeasured && len != 8192) << "each bucket is measured once";
    EXPECT_EQ(ex.plan_for(r).kernel, r.kernel);
    EXPECT_TRUE(w.check_appended(ex, 0)) << "len " << len;
    EXPECT_TRUE(w.check_layer(ex, 0)) << to_string(policy) << " batch " << batch << " len " << len;
  }
}

INSTANTIATE_TEST_SUITE_P(Host, PolicyAcrossThreshold,
                         ::testing::Combine(::testing::Values(KernelPolicy::kAuto, KernelPolicy::kThreshold,
                                                              KernelPolicy::kMeasured),
                                            ::testing::Values(1, 7, 17)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_batch" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------- kMeasured

// A deterministic clock: each candidate's microseconds per replay come from a table.
double by_candidate(const BucketPlan&, const PlanCandidate& c, double v1, double p_auto, double p_half,
                    double p_double, int auto_p) {
  if (c.kernel == KernelKind::kV1) return v1;
  if (c.partition_size == auto_p) return p_auto;
  return c.partition_size < auto_p ? p_half : p_double;
}

TEST(ExecutorHost, MeasuredKeepsTheFastestCandidateAndRecordsEveryTime) {
  const AttentionSpec s = small_spec(DType::kFloat32);
  World w(s, 2, 8, 4096, 61);
  ExecutorConfig c = w.config(8, 4096);  // bands 512 1024 2048 4096, all <= the threshold
  c.policy = KernelPolicy::kMeasured;
  c.device_model.num_sms = 132;
  c.device_model.blocks_per_sm = 5;
  // Batch bucket 4 (8 blocks per partition), band (2048, 4096]: kAuto's cost model picks V2 at its
  // shortest partition, 64 tokens (the candidates are V1, 64 and 128: 32 is below the shortest).
  const BucketPlan before = plan_buckets(c)[2 * 4 + 3];
  ASSERT_EQ(before.batch, 4);
  ASSERT_EQ(before.band_hi, 4096);
  ASSERT_EQ(before.kernel, KernelKind::kV2);
  ASSERT_EQ(before.partition_size, 64);
  int calls = 0;
  c.measure_clock = [&](const BucketPlan& b, const PlanCandidate& cand) {
    ++calls;
    EXPECT_EQ(b.batch, 4);
    return by_candidate(b, cand, 50.0, 30.0, 20.0, 10.0, 64);  // twice kAuto's P is fastest
  };
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  w.set_lens({3000, 4000, 2500});
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());
  EXPECT_TRUE(r.measured);
  EXPECT_TRUE(r.captured);
  EXPECT_EQ(calls, 3);  // V1, 64, 128
  const BucketPlan& p = ex.plan_for(r);
  EXPECT_EQ(p.reason, PlanReason::kMeasuredFastest);
  EXPECT_EQ(p.kernel, KernelKind::kV2);
  EXPECT_EQ(p.partition_size, 128);
  EXPECT_EQ(r.partition_size, 128);
  ASSERT_EQ(p.candidates.size(), 3u);
  EXPECT_EQ(p.candidates[0].us, 50.0);
  EXPECT_EQ(p.candidates[1].us, 30.0);
  EXPECT_EQ(p.candidates[2].us, 10.0);
  for (const PlanCandidate& k : p.candidates) EXPECT_GT(k.predicted_us, 0.0);  // the model's, beside each
  EXPECT_NE(describe_reason(p).find("v2/P128 10.0 us"), std::string::npos) << describe_reason(p);
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_layer(ex, 1));
  EXPECT_TRUE(w.check_appended(ex, 1));

  w.set_lens({3100, 4001, 2600});  // same bucket: neither measured nor captured again
  w.fill_step(ex);
  const StepResult r2 = ex.step(w.inputs());
  EXPECT_FALSE(r2.measured);
  EXPECT_FALSE(r2.captured);
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(w.check_layer(ex, 0));
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.measured_buckets, 1);
  EXPECT_EQ(st.candidate_graphs, 3);
  EXPECT_GE(st.measure_ms, 0.0);
  EXPECT_EQ(st.undecided_buckets, st.buckets - 1);
  EXPECT_EQ(st.total_captures, 1);
}

TEST(ExecutorHost, MeasuredBucketsWithTheSameLaunchShareAGraph) {
  const AttentionSpec s = small_spec(DType::kFloat32);
  World w(s, 1, 4, 2048, 67);
  ExecutorConfig c = w.config(4, 2048);  // bands 512 1024 2048; threshold 8192: V1 may win everywhere
  c.policy = KernelPolicy::kMeasured;
  c.measure_clock = [](const BucketPlan& b, const PlanCandidate& cand) {
    return by_candidate(b, cand, 1.0, 2.0, 3.0, 4.0, -1);  // V1 fastest
  };
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  int graph = -1;
  for (int len : {300, 900, 1500}) {  // three bands of batch bucket 4
    w.set_lens({len, 40, len - 7});
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    EXPECT_TRUE(r.measured) << len;
    EXPECT_EQ(r.kernel, KernelKind::kV1);
    EXPECT_EQ(r.captured, len == 300) << "the V1 graph of this batch bucket already exists";
    if (graph < 0) graph = r.graph_id;
    EXPECT_EQ(r.graph_id, graph);
    EXPECT_TRUE(w.check_layer(ex, 0)) << len;
  }
  const ExecutorStats st = ex.stats();
  ASSERT_EQ(st.graphs.size(), 1u);
  EXPECT_EQ(st.graphs[0].buckets, 3);
  EXPECT_EQ(st.graphs[0].band, 0);
  EXPECT_EQ(st.graphs[0].last_band, 2);
  EXPECT_EQ(st.graphs[0].replays, 3);
  EXPECT_EQ(st.distinct_graphs, 1);
  EXPECT_EQ(st.measured_buckets, 3);
}

// Under kUpFront, kMeasured times every bucket at construction on staged lengths of its own: the
// candidates write nothing but executor memory (no KV append, no caller output, no step body).
TEST(ExecutorHost, MeasuredUpFrontWritesNoCallerMemory) {
  const AttentionSpec s = small_spec(DType::kBFloat16, KVLayout::kNHD);
  World w(s, 2, 4, 2048, 71);
  ExecutorConfig c = w.config(4, 2048);
  c.policy = KernelPolicy::kMeasured;
  c.capture = CapturePolicy::kUpFront;
  c.measure_replays = 1;
  std::vector<dgtest::Buffer> outs;
  for (int l = 0; l < 2; ++l) {
    outs.push_back(dgtest::make_buffer(s.dtype, w.q_elems(4)));
    dgtest::poison(s.dtype, outs.back().data(), w.q_elems(4));
    c.layers[l].out = outs.back().data();
  }
  const std::vector<std::uint64_t> k0 = w.k[0].words, v1 = w.v[1].words, out0 = outs[0].words;
  int body_calls = 0;
  Executor ex(c, [&](StepContext& ctx) {
    ++body_calls;
    for (int l = 0; l < 2; ++l) {
      ctx.append_kv(l);
      ctx.attention(l);
    }
  });
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.undecided_buckets, 0);
  EXPECT_EQ(st.measured_buckets, st.buckets);
  EXPECT_EQ(st.total_captures, st.distinct_graphs);
  EXPECT_EQ(body_calls, st.distinct_graphs) << "the body runs once per graph, never for a candidate";
  EXPECT_EQ(w.k[0].words, k0);
  EXPECT_EQ(w.v[1].words, v1);
  EXPECT_EQ(outs[0].words, out0) << "a candidate wrote the caller's output";
  for (const BucketPlan& p : ex.plans()) EXPECT_EQ(p.reason, PlanReason::kMeasuredFastest);

  w.set_lens({1000, 2000, 17});
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());
  EXPECT_FALSE(r.measured);
  EXPECT_FALSE(r.captured);
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_layer(ex, 1));
}

TEST(ExecutorHost, FailedMeasurementLeavesTheBucketUnmeasuredAndUsable) {
  const AttentionSpec s = small_spec();
  World w(s, 1, 4, 1024, 73);
  ExecutorConfig c = w.config(4, 1024);
  c.policy = KernelPolicy::kMeasured;
  c.measure_replays = 1;
  Executor ex(c);
  w.set_lens({600, 700});
  for (fault::Site site : {fault::Site::kCaptureBegin, fault::Site::kInstantiate, fault::Site::kGraphLaunch}) {
    {
      fault::ScopedFault f(site);  // the first capture, instantiation or launch is a candidate's
      w.fill_step(ex);
      EXPECT_THROW(ex.step(w.inputs()), Error) << fault::to_string(site);
    }
    EXPECT_EQ(ex.plan_for_batch(2, 1).graph_id, -1) << fault::to_string(site);
    EXPECT_EQ(ex.stats().measured_buckets, 0);
    EXPECT_EQ(ex.stats().total_captures, 0);
  }
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());
  EXPECT_TRUE(r.measured);
  EXPECT_TRUE(r.captured);
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_EQ(ex.stats().rejected_steps, 3);
}

// ---------------------------------------------------------------- graphs shared by buckets

TEST(ExecutorHost, SharedGraphCapturesTheBodyOnceWithThePlanSpanningItsBuckets) {
  const AttentionSpec s = small_spec();
  World w(s, 1, 4, 2048, 79);
  ExecutorConfig c = w.config(4, 2048);  // bands 512 1024 2048
  c.v2_threshold = 1024;
  c.policy = KernelPolicy::kThreshold;  // bands 0 and 1 run V1: one launch, sized for 1024
  std::vector<BucketPlan> seen;
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c, [&](StepContext& ctx) {
    seen.push_back(ctx.plan());
    ctx.append_kv(0);
    ctx.attention(0);
  });
  ASSERT_EQ(ex.plan_for_batch(4, 0).graph_id, ex.plan_for_batch(4, 1).graph_id);
  ASSERT_NE(ex.plan_for_batch(4, 1).graph_id, ex.plan_for_batch(4, 2).graph_id);
  for (int len : {200, 1000, 400, 1500}) {
    w.set_lens({len, 3, 77, len / 2});
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    EXPECT_EQ(r.captured, len == 200 || len == 1500) << len;
    EXPECT_TRUE(w.check_layer(ex, 0)) << len;
    EXPECT_TRUE(w.check_appended(ex, 0)) << len;
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].kernel, KernelKind::kV1);
  EXPECT_EQ(seen[0].band, 0);
  EXPECT_EQ(seen[0].band_lo, 0);
  EXPECT_EQ(seen[0].band_hi, 1024);
  EXPECT_EQ(seen[0].launch_len, 1024);
  EXPECT_EQ(seen[1].kernel, KernelKind::kV2);
  EXPECT_EQ(seen[1].band_lo, 1024);
  EXPECT_EQ(seen[1].band_hi, 2048);
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.total_captures, 2);
  ASSERT_EQ(st.graphs.size(), 2u);
  EXPECT_EQ(st.graphs[0].buckets, 2);
  EXPECT_EQ(st.graphs[0].replays, 3);
  EXPECT_EQ(st.graphs[0].band_lo, 0);
  EXPECT_EQ(st.graphs[0].band_hi, 1024);
  EXPECT_EQ(st.graphs[1].buckets, 1);
}

// ---------------------------------------------------------------- buckets and padding

TEST(ExecutorHost, BatchAndBandBucketEdges) {
  const AttentionSpec s = small_spec();
  World w(s, 1, 24, 2048, 5);
  Executor ex(w.config(24, 2048));  // buckets 1 2 4 8 16 24; bands 512 1024 2048
  const std::vector<std::pair<int, int>> batch_cases = {{1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8},
                                                        {8, 8}, {9, 16}, {16, 16}, {17, 24}, {24, 24}};
  for (auto [n, bucket] : batch_cases) {
    w.set_lens(random_lens(w.rng, n, 1, 100));
    w.fill_step(ex);
    EXPECT_EQ(ex.step(w.inputs()).bucket_batch_size, bucket) << "num_seqs " << n;
    EXPECT_TRUE(w.check_layer(ex, 0)) << "num_seqs " << n;
  }
  const std::vector<std::pair<int, int>> band_cases = {{1, 0}, {512, 0}, {513, 1}, {1024, 1}, {1025, 2}, {2048, 2}};
  for (auto [len, band] : band_cases) {
    w.set_lens({len, 1});
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    EXPECT_EQ(r.band, band) << "len " << len;
    EXPECT_TRUE(w.check_layer(ex, 0)) << "len " << len;
  }
}

TEST(ExecutorHost, PaddedRowsGetLengthZeroAndStayUntouched) {
  const AttentionSpec s = small_spec(DType::kBFloat16, KVLayout::kNHD);
  World w(s, 1, 24, 1024, 9);
  Executor ex(w.config(24, 1024));
  const std::size_t cache_bytes = w.k[0].bytes;
  for (auto [n, bucket] : std::vector<std::pair<int, int>>{{7, 8}, {17, 24}}) {
    dgtest::poison(s.dtype, ex.output(0), w.q_elems(24));
    w.set_lens(random_lens(w.rng, n, 1, 1024));
    w.fill_step(ex);
    // Fill the padded rows' new K/V too: if a padded row were appended, the caches would change.
    dgtest::fill_uniform(s.dtype, ex.new_key(0), w.kv_elems(24), w.rng);
    dgtest::fill_uniform(s.dtype, ex.new_value(0), w.kv_elems(24), w.rng);
    std::vector<char> k_before(cache_bytes), v_before(cache_bytes);
    std::memcpy(k_before.data(), w.k[0].data(), cache_bytes);
    std::memcpy(v_before.data(), w.v[0].data(), cache_bytes);
    const StepResult r = ex.step(w.inputs());
    EXPECT_EQ(r.bucket_batch_size, bucket);
    EXPECT_TRUE(w.check_layer(ex, 0));
    EXPECT_TRUE(all_nan_rows(s, ex.output(0), n, bucket)) << "padded output rows were written";
    EXPECT_TRUE(w.check_appended(ex, 0));
    // Only the live rows' slots changed in the caches.
    std::vector<char> k_after(cache_bytes);
    std::memcpy(k_after.data(), w.k[0].data(), cache_bytes);
    std::memcpy(w.k[0].data(), k_before.data(), cache_bytes);
    std::memcpy(w.v[0].data(), v_before.data(), cache_bytes);
    // Restore-and-replay check: re-appending the live rows only must reproduce k_after exactly.
    AppendArgs a;
    a.spec = s;
    a.num_tokens = n;
    a.num_blocks = w.num_blocks;
    a.key = ex.new_key(0);
    a.value = ex.new_value(0);
    a.k_cache = w.k[0].data();
    a.v_cache = w.v[0].data();
    a.slot_mapping = w.slots.data();
    host::append_kv(a);
    EXPECT_EQ(std::memcmp(k_after.data(), w.k[0].data(), cache_bytes), 0) << "a padded row was appended";
  }
}

// ---------------------------------------------------------------- capture policy and reuse

TEST(ExecutorHost, UpFrontCapturesEverythingLazyCapturesOnFirstUse) {
  const AttentionSpec s = small_spec();
  World w(s, 1, 8, 1024, 13);
  ExecutorConfig c = w.config(8, 1024);
  c.capture = CapturePolicy::kUpFront;
  Executor up(c);
  const int n_plans = up.stats().distinct_graphs;
  EXPECT_EQ(up.stats().total_captures, n_plans);
  c.capture = CapturePolicy::kLazy;
  Executor lazy(c);
  EXPECT_EQ(lazy.stats().total_captures, 0);

  w.set_lens({300, 700, 5});
  for (Executor* ex : {&up, &lazy}) {
    w.fill_step(*ex);
    const StepResult r = ex->step(w.inputs());
    EXPECT_EQ(r.captured, ex == &lazy);
    EXPECT_TRUE(w.check_layer(*ex, 0));
  }
  EXPECT_EQ(up.stats().total_captures, n_plans);
  EXPECT_EQ(lazy.stats().total_captures, 1);
  lazy.capture_all();
  EXPECT_EQ(lazy.stats().total_captures, n_plans);  // the captured bucket is not captured again
}

TEST(ExecutorHost, ReusingABucketNeverRecaptures) {
  const AttentionSpec s = small_spec(DType::kFloat16);
  World w(s, 2, 8, 1024, 17);
  ExecutorConfig c = w.config(8, 1024);
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  for (int k = 0; k < 6; ++k) {
    w.set_lens(random_lens(w.rng, 5 + k % 4, 600, 1024));  // batch bucket 8, band (512, 1024]
    w.fill_step(ex);
    EXPECT_EQ(ex.step(w.inputs()).captured, k == 0);
    EXPECT_TRUE(w.check_layer(ex, 0));
    EXPECT_TRUE(w.check_layer(ex, 1));
  }
  const ExecutorStats st = ex.stats();
  ASSERT_EQ(st.graphs.size(), 1u);
  EXPECT_EQ(st.graphs[0].captures, 1);
  EXPECT_EQ(st.graphs[0].replays, 6);
  EXPECT_EQ(st.graphs[0].nodes, 5);  // append + attention per layer, then the bad-block flag's copy
}

// ---------------------------------------------------------------- recovery

TEST(ExecutorHost, RejectedStepThenGoodStep) {
  const AttentionSpec s = small_spec();
  World w(s, 1, 8, 1024, 19);
  Executor ex(w.config(8, 1024));
  w.set_lens({100, 900});
  w.lens[1] = 2000;  // > max_seq_len
  EXPECT_THROW(ex.step(w.inputs()), Error);
  EXPECT_EQ(ex.stats().steps, 0);
  EXPECT_EQ(ex.stats().rejected_steps, 1);
  EXPECT_EQ(ex.stats().total_captures, 0);
  w.set_lens({100, 900});
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_EQ(ex.stats().steps, 1);
}

TEST(ExecutorHost, ExceptionInsideStepBodyDuringCaptureLeavesExecutorUsable) {
  const AttentionSpec s = small_spec();
  World w(s, 2, 8, 1024, 23);
  int calls = 0;
  Executor ex(w.config(8, 1024), [&](StepContext& ctx) {
    ++calls;
    ctx.append_kv(0);
    ctx.attention(0);
    if (calls == 1) throw std::runtime_error("caller failure mid-capture");
    ctx.append_kv(1);
    ctx.attention(1);
  });
  w.set_lens({40, 50, 60});
  w.fill_step(ex);
  EXPECT_THROW(ex.step(w.inputs()), std::runtime_error);
  EXPECT_EQ(ex.stats().total_captures, 0);  // no partial graph was kept
  EXPECT_EQ(ex.stats().rejected_steps, 1);
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());
  EXPECT_TRUE(r.captured);
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_layer(ex, 1));
  EXPECT_TRUE(w.check_appended(ex, 1));
  EXPECT_EQ(calls, 2);
}

// ---------------------------------------------------------------- the step body

TEST(ExecutorHost, MultiLayerStepBodyWithCallerWorkBetweenLayers) {
  const AttentionSpec s = small_spec(DType::kFloat32, KVLayout::kNHD);
  const int L = 4;
  World w(s, L, 8, 1024, 29);
  std::vector<int> order;
  Executor* exp = nullptr;
  // The caller's "layer work": q of layer l+1 = 0.5 * out of layer l + 0.25, over the bucket's rows.
  Executor ex(w.config(8, 1024), [&](StepContext& ctx) {
    const int rows = ctx.plan().batch;
    for (int l = 0; l < L; ++l) {
      ctx.append_kv(l);
      ctx.attention(l);
      if (l + 1 < L)
        ctx.enqueue_host([&, l, rows] {
          order.push_back(l);
          const std::size_t n = w.q_elems(rows);
          for (std::size_t i = 0; i < n; ++i)
            store_from_float(s.dtype, exp->query(l + 1), i, 0.5f * load_as_float(s.dtype, exp->output(l), i) + 0.25f);
        });
    }
  });
  exp = &ex;
  for (int k = 0; k < 3; ++k) {
    order.clear();
    w.set_lens(random_lens(w.rng, 3 + k, 1, 1024));
    w.fill_step(ex);  // q of layers 1..3 is overwritten by the caller work during the step
    ex.step(w.inputs());
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2})) << "step " << k;
    for (int l = 0; l < L; ++l) {
      EXPECT_TRUE(w.check_layer(ex, l)) << "step " << k << " layer " << l;
      EXPECT_TRUE(w.check_appended(ex, l)) << "step " << k << " layer " << l;
    }
    // Layer l+1 ran on the caller-transformed output of layer l.
    for (int l = 0; l + 1 < L; ++l)
      EXPECT_FLOAT_EQ(load_as_float(s.dtype, ex.query(l + 1), 3),
                      0.5f * load_as_float(s.dtype, ex.output(l), 3) + 0.25f);
  }
}

TEST(ExecutorHost, HostGraphDoesNotSeeAPointerChangedAfterCapture) {
  const AttentionSpec s = small_spec();
  World w(s, 1, 4, 1024, 31);
  ExecutorConfig c = w.config(4, 1024);
  c.append_kv = false;
  dgtest::Buffer qa = dgtest::make_buffer(s.dtype, w.q_elems(4)), qb = dgtest::make_buffer(s.dtype, w.q_elems(4));
  dgtest::Buffer out = dgtest::make_buffer(s.dtype, w.q_elems(4));
  dgtest::fill_uniform(s.dtype, qa.data(), w.q_elems(4), w.rng);
  dgtest::fill_uniform(s.dtype, qb.data(), w.q_elems(4), w.rng);
  const void* q_now = qa.data();
  Executor ex(c, [&](StepContext& ctx) { ctx.attention(0, q_now, out.data()); });
  w.set_lens({100, 200, 300});
  ex.step(w.inputs());  // captures with qa bound
  const dgtest::Tol t = dgtest::tol_for(s.dtype);
  std::vector<double> ref_a = w.reference(0, qa.data());
  EXPECT_TRUE(dgtest::check_close(s.dtype, out.data(), ref_a.data(), 3, s.num_q_heads, s.head_size, t.atol, t.rtol));

  q_now = qb.data();  // changed after capture: the graph must keep reading qa
  w.set_lens({150, 250, 350});  // staged values, in contrast, are seen
  EXPECT_FALSE(ex.step(w.inputs()).captured);
  ref_a = w.reference(0, qa.data());
  EXPECT_TRUE(dgtest::check_close(s.dtype, out.data(), ref_a.data(), 3, s.num_q_heads, s.head_size, t.atol, t.rtol));
  const std::vector<double> ref_b = w.reference(0, qb.data());
  EXPECT_FALSE(dgtest::check_close(s.dtype, out.data(), ref_b.data(), 3, s.num_q_heads, s.head_size, t.atol, t.rtol));
}

TEST(ExecutorHost, DeviceSpaceInputsAndAlibi) {
  const AttentionSpec s = small_spec(DType::kBFloat16);
  World w(s, 1, 8, 2048, 37);
  ExecutorConfig c = w.config(8, 2048);
  c.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  c.v2_threshold = 1024;
  Executor ex(c);
  for (int k = 0; k < 3; ++k) {
    w.set_lens(random_lens(w.rng, 6, 1, 2048));
    w.fill_step(ex);
    StepInputs in = w.inputs();
    in.space = MemorySpace::kDevice;  // on the host backend "device" memory is host memory
    ex.step(in);
    EXPECT_TRUE(w.check_layer(ex, 0, c.alibi_slopes.data()));
  }
}

// ---------------------------------------------------------------- fault seam and memory

TEST(ExecutorHost, InjectedFaultsNameTheCallAndTheNextStepWorks) {
  const AttentionSpec s = small_spec();
  World w(s, 1, 8, 1024, 41);
  w.set_lens({10, 20});
  const fault::Site sites[] = {fault::Site::kMemcpy, fault::Site::kCaptureBegin, fault::Site::kCaptureEnd,
                               fault::Site::kInstantiate, fault::Site::kGraphLaunch, fault::Site::kKernelLaunch};
  for (fault::Site site : sites) {
    Executor ex(w.config(8, 1024));  // lazy: the faulted step is the one that captures
    {
      fault::ScopedFault f(site);
      w.fill_step(ex);
      try {
        ex.step(w.inputs());
        ADD_FAILURE() << "no Error for site " << fault::to_string(site);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(fault::to_string(site)), std::string::npos) << e.what();
      }
      EXPECT_EQ(fault::fired(site), 1) << fault::to_string(site);
      EXPECT_EQ(ex.stats().rejected_steps, 1);
      EXPECT_EQ(ex.stats().steps, 0);
    }
    w.fill_step(ex);
    ex.step(w.inputs());
    EXPECT_TRUE(w.check_layer(ex, 0)) << "after " << fault::to_string(site);
    // Capture-side faults leave no graph (the good step captured the only one); launch and kernel
    // faults hit a complete graph, which the good step reused.
    EXPECT_EQ(ex.stats().total_captures, 1) << fault::to_string(site);
  }

  fault::ScopedFault f(fault::Site::kAlloc, 2);
  try {
    Executor broken(w.config(8, 1024));
    ADD_FAILURE() << "no Error for an injected allocation failure";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("alloc"), std::string::npos) << e.what();
  }
}

TEST(ExecutorHost, HostBackendUpdateFallsBackToReinstantiation) {
  auto b = detail::make_host_backend();
  std::vector<int> ran;
  b->begin_capture();
  b->host_work([&] { ran.push_back(1); });
  auto g = b->end_capture_and_instantiate();
  b->launch(*g);
  EXPECT_EQ(ran, (std::vector<int>{1}));
  {
    fault::ScopedFault f(fault::Site::kGraphUpdate);  // the update is refused: re-instantiated
    b->begin_capture();
    b->host_work([&] { ran.push_back(2); });
    b->host_work([&] { ran.push_back(3); });
    EXPECT_FALSE(b->end_capture_and_update(*g)) << "a refused update is reported as a re-instantiation";
  }
  b->begin_capture();
  b->host_work([&] { ran.push_back(2); });
  b->host_work([&] { ran.push_back(3); });
  EXPECT_TRUE(b->end_capture_and_update(*g)) << "an accepted update is in place";
  EXPECT_EQ(g->nodes(), 2);
  b->launch(*g);
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  fault::arm(fault::Site::kGraphUpdate);
  fault::arm(fault::Site::kInstantiate);
  b->begin_capture();
  b->host_work([&] { ran.push_back(4); });
  EXPECT_THROW(b->end_capture_and_update(*g), Error);
  fault::disarm_all();
  b->launch(*g);  // the old executable graph is intact
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3, 2, 3}));
}

TEST(ExecutorHost, MemoryIsAccountedAndTheBudgetEnforced) {
  const AttentionSpec s = small_spec(DType::kFloat16);
  World w(s, 2, 8, 4096, 43);
  ExecutorConfig c = w.config(8, 4096);
  c.v2_threshold = 1024;
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  const MemoryReport m = ex.memory();
  const std::size_t qb = 8 * 4 * 64 * 2, kvb = 8 * 2 * 64 * 2;
  const std::size_t staged = 8 * 4 + 8 * (4096 / 16) * 4 + 8 * 8 + 4;  // + the bad-block flag
  EXPECT_EQ(m.static_buffers, staged + 2 * (2 * qb + 2 * kvb));
  EXPECT_GT(m.workspace, 0u);
  EXPECT_EQ(m.graphs, 0u);
  EXPECT_EQ(m.total(), m.static_buffers + m.workspace);

  c.memory_budget_bytes = m.total() - 1;
  try {
    Executor over(c);
    ADD_FAILURE() << "budget not enforced";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("memory_budget_bytes = " + std::to_string(m.total() - 1)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(m.total())), std::string::npos) << msg;
  }
  c.memory_budget_bytes = m.total();
  EXPECT_NO_THROW(Executor fits(c));
}

}  // namespace

// ExecutorConfig::programmatic_launch: on by default; the host backend has nothing to overlap, so
// it is never in effect there, and stats() says why (requested or turned off). The same outputs
// either way (the flag only changes how CUDA launches are ordered).
TEST(ExecutorHost, ProgrammaticLaunchIsOnByDefaultAndReportedNotInEffectOnTheHost) {
  EXPECT_TRUE(ExecutorConfig{}.programmatic_launch);
  EXPECT_FALSE(DecodeArgs{}.programmatic_launch) << "the eager API leaves PDL to its caller";
  EXPECT_FALSE(AppendArgs{}.programmatic_launch);
  const AttentionSpec s = small_spec();
  std::vector<std::vector<char>> outs;
  for (bool pdl : {true, false}) {
    World w(s, 2, 3, 1024, 5);
    ExecutorConfig c = w.config(3, 1024);
    c.backend = BackendKind::kHost;
    c.programmatic_launch = pdl;
    Executor ex(c);
    EXPECT_EQ(ex.config().programmatic_launch, pdl);
    const ExecutorStats st = ex.stats();
    EXPECT_FALSE(st.programmatic_launch);
    EXPECT_NE(st.programmatic_launch_note.find(pdl ? "host backend" : "programmatic_launch = false"), std::string::npos)
        << st.programmatic_launch_note;
    w.set_lens({700, 3, 1024});
    w.fill_step(ex);
    ex.step(w.inputs());
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(w.check_layer(ex, l)) << "pdl " << pdl << " layer " << l;
  }
}
