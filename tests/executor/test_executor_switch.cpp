// BandSelect::kDevice on the host backend (issue 12): one graph per batch bucket whose SWITCH nodes
// run the branch the staged lengths select when the graph replays, against kHost and the float64
// reference; the fallback when conditional nodes are missing; and the engine paths of issues 8/11
// (hint, device inputs, rebind_layers, caller stream, strides through a body, kMeasured) under it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "exec_world.hpp"
#include "kernels/band_select.cuh"

namespace {
using namespace decodegraph;
using dgtest::World;

AttentionSpec spec(DType dtype = DType::kFloat32) { return dgtest::small_spec(dtype); }

// The kernel (V1 or V2) a step's attention ran, read off the host twin's launch name: with
// kKernelLaunch armed past the band select and the append, the attention launch fails and names
// itself. Independent of the branch counters the executor keeps. The step throws; the executor
// stays usable (checked by the callers' next step).
std::string kernel_that_runs(Executor& ex, const StepInputs& in) {
  return dgtest::failing_kernel([&] { ex.step(in); }, /*skip=*/2);  // band select, append, then attention
}

// The world's current inputs written into the executor's host staging buffers, and inputs that
// point at them (step() then copies nothing on the host); `handed_out` gets the buffers written.
StepInputs inputs_in_host_staging(Executor& ex, const World& w, HostStaging* handed_out = nullptr) {
  HostStaging h = ex.host_staging();
  if (handed_out) *handed_out = h;
  std::copy(w.lens.begin(), w.lens.end(), h.seq_lens.begin());
  std::copy(w.slots.begin(), w.slots.end(), h.slot_mapping.begin());
  for (std::size_t i = 0; i < w.lens.size(); ++i)
    std::copy(w.tables.begin() + i * w.stride, w.tables.begin() + (i + 1) * w.stride,
              h.block_tables.begin() + i * h.block_table_stride);
  StepInputs in = w.inputs();
  in.seq_lens = h.seq_lens.data();
  in.slot_mapping = h.slot_mapping.data();
  in.block_tables = h.block_tables.data();
  in.block_table_stride = h.block_table_stride;
  return in;
}

TEST(BandSelectMath, FirstEdgeAtOrAboveTheLongestLengthAndClampedPastTheLast) {
  const std::vector<int> edges = {512, 1024, 8192, 8448};
  const int n = static_cast<int>(edges.size());
  // Expected bands worked out from the definition: lengths in (edge[b-1], edge[b]] are band b.
  EXPECT_EQ(kernels::select_band(0, edges.data(), n), 0);
  EXPECT_EQ(kernels::select_band(1, edges.data(), n), 0);
  EXPECT_EQ(kernels::select_band(512, edges.data(), n), 0);
  EXPECT_EQ(kernels::select_band(513, edges.data(), n), 1);
  EXPECT_EQ(kernels::select_band(8192, edges.data(), n), 2);
  EXPECT_EQ(kernels::select_band(8193, edges.data(), n), 3);
  EXPECT_EQ(kernels::select_band(8448, edges.data(), n), 3);
  EXPECT_EQ(kernels::select_band(100000, edges.data(), n), 3) << "past the last edge: the last band";
  const int32_t lens[] = {7, 0, -3, 9000, 0};
  EXPECT_EQ(kernels::longest_length(lens, 5), 9000);
  const int32_t padded[] = {0, 0, -1};
  EXPECT_EQ(kernels::longest_length(padded, 3), 0);
}

// The test: one graph for the bucket, lengths crossing 8192 between two replays of it, no
// recapture; the first replay runs V1 and the second V2.
TEST(BandSelectDevice, BranchFollowsTheStagedLengthsAtReplayWithoutRecapture) {
  const int max_len = 8448;
  World w(spec(), 1, 2, max_len, 121);
  ExecutorConfig c = w.config(2, max_len);  // bands ..., 4096, 8192, 8448
  c.policy = KernelPolicy::kThreshold;      // V1 up to 8192, V2 above
  c.batch_buckets = {2};
  Executor ex(c);
  ASSERT_EQ(ex.band_select(), BandSelect::kDevice);

  w.set_lens({8190, 8000});
  w.fill_step(ex);
  const StepResult r1 = ex.step(w.inputs());
  EXPECT_TRUE(r1.captured);
  EXPECT_TRUE(r1.band_on_device);
  EXPECT_EQ(r1.kernel, KernelKind::kV1);  // known on the host: host inputs were read
  EXPECT_TRUE(w.check_layer(ex, 0));
  ExecutorStats st = ex.stats();
  ASSERT_EQ(st.graphs.size(), 1u);
  EXPECT_EQ(st.replays(KernelKind::kV1), 1);
  EXPECT_EQ(st.replays(KernelKind::kV2), 0);

  w.set_lens({8190, 8300});  // crosses 8192: the same graph must now run its V2 branch
  w.fill_step(ex);
  const StepResult r2 = ex.step(w.inputs());
  EXPECT_FALSE(r2.captured);
  EXPECT_EQ(r2.graph_id, r1.graph_id);
  EXPECT_EQ(r2.kernel, KernelKind::kV2);
  EXPECT_TRUE(w.check_layer(ex, 0));
  st = ex.stats();
  ASSERT_EQ(st.graphs.size(), 1u);
  EXPECT_EQ(st.total_captures, 1);
  EXPECT_EQ(st.graphs[0].captures, 1);
  EXPECT_EQ(st.graphs[0].replays, 2);
  EXPECT_EQ(st.replays(KernelKind::kV1), 1);
  EXPECT_EQ(st.replays(KernelKind::kV2), 1);

  // The same, read off the launches themselves rather than the counters.
  w.set_lens({8000, 17});
  w.fill_step(ex);
  EXPECT_EQ(kernel_that_runs(ex, w.inputs()), "v1");
  w.set_lens({17, 8193});
  w.fill_step(ex);
  EXPECT_EQ(kernel_that_runs(ex, w.inputs()), "v2");
  w.fill_step(ex);
  EXPECT_FALSE(ex.step(w.inputs()).captured) << "usable after the injected failure, still no recapture";
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_EQ(ex.stats().total_captures, 1);
}

// Growing 8000 -> 8400 through one graph: the branch counters split as the bands do.
TEST(BandSelectDevice, GrowingFrom8000To8400CountsEachBranch) {
  const int max_len = 8448;
  World w(spec(DType::kBFloat16), 1, 2, max_len, 123);
  ExecutorConfig c = w.config(2, max_len);
  c.policy = KernelPolicy::kThreshold;
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  for (int len = 8000; len <= 8400; len += 8) {
    w.set_lens({len, len - 37});
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    ASSERT_EQ(r.kernel, len <= 8192 ? KernelKind::kV1 : KernelKind::kV2) << len;
    ASSERT_TRUE(w.check_layer(ex, 0)) << "len " << len;
  }
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.replays(KernelKind::kV1), 25);  // 8000, 8008, ..., 8192
  EXPECT_EQ(st.replays(KernelKind::kV2), 26);  // 8200, ..., 8400
  EXPECT_EQ(st.total_captures, 1);
  ASSERT_EQ(st.graphs.size(), 1u);
  EXPECT_TRUE(st.graphs[0].switch_graph);
  const std::vector<int> edges = ex.config().band_edges;
  ASSERT_EQ(st.graphs[0].band_replays.size(), edges.size());
  EXPECT_EQ(st.graphs[0].band_replays[edges.size() - 2], 25);  // (4096, 8192]
  EXPECT_EQ(st.graphs[0].band_replays.back(), 26);             // (8192, 8448]
}

// kDevice and kHost replay the same launches: bitwise equal outputs, across bands and batches
// with padded rows (7 in bucket 8, 17 in bucket 24).
TEST(BandSelectDevice, MatchesKHostBitwiseAndTheReference) {
  const int max_len = 8448;
  for (const int batch : {1, 7, 17}) {
    World w(spec(DType::kFloat16), 2, batch, max_len, 131 + batch);
    ExecutorConfig ch = w.config(24, max_len);
    ch.band_select = BandSelect::kHost;
    ExecutorConfig cd = ch;
    cd.band_select = BandSelect::kDevice;
    Executor eh(ch), ed(cd);
    std::mt19937_64 rng(batch);
    for (const int longest : {1, 15, 17, 511, 8191, 8192, 8193}) {
      std::vector<int> lens(batch);
      for (int& l : lens) l = 1 + static_cast<int>(rng() % longest);
      lens[batch / 2] = longest;
      w.set_lens(lens);
      w.fill_step(ed);
      for (int l = 0; l < 2; ++l) {  // the same q and new K/V for both
        std::memcpy(eh.query(l), ed.query(l), w.q_elems(batch) * dtype_size(w.spec.dtype));
        std::memcpy(eh.new_key(l), ed.new_key(l), w.kv_elems(batch) * dtype_size(w.spec.dtype));
        std::memcpy(eh.new_value(l), ed.new_value(l), w.kv_elems(batch) * dtype_size(w.spec.dtype));
      }
      const StepResult rh = eh.step(w.inputs());
      const StepResult rd = ed.step(w.inputs());
      EXPECT_EQ(rd.band, rh.band);
      EXPECT_EQ(rd.kernel, rh.kernel);
      for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(0, std::memcmp(eh.output(l), ed.output(l), w.q_elems(batch) * dtype_size(w.spec.dtype)))
            << "batch " << batch << " longest " << longest << " layer " << l;
        EXPECT_TRUE(w.check_layer(ed, l)) << "batch " << batch << " longest " << longest;
      }
    }
    // One graph per batch bucket replayed; kHost captured one per distinct plan it met.
    EXPECT_EQ(ed.stats().total_captures, 1);
    EXPECT_GE(eh.stats().total_captures, 2);
  }
}

TEST(BandSelectDevice, OneGraphPerBatchBucketWithIdenticalBranchesRecordedOnce) {
  World w(spec(), 1, 8, 4096, 141);
  ExecutorConfig c = w.config(8, 4096);  // buckets 1 2 4 8; bands 512 1024 2048 4096
  c.capture = CapturePolicy::kUpFront;
  Executor ex(c);
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.band_select, BandSelect::kDevice);
  EXPECT_EQ(st.distinct_graphs, 4);
  ASSERT_EQ(st.graphs.size(), 4u);
  EXPECT_EQ(st.total_captures, 4);
  for (const GraphStats& g : st.graphs) {
    // The bands whose plans share a graph under kHost share a branch recording here.
    std::set<int> ids;
    for (const BucketPlan& p : ex.plans())
      if (p.batch == g.batch) ids.insert(p.graph_id);
    EXPECT_EQ(g.branches, static_cast<int>(ids.size())) << "batch " << g.batch;
    EXPECT_EQ(g.buckets, 4);
    EXPECT_EQ(g.band, 0);
    EXPECT_EQ(g.last_band, 3);
  }
  // The step replays the bucket's graph without capturing.
  w.set_lens({3000, 10, 600});
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());
  EXPECT_FALSE(r.captured);
  EXPECT_EQ(r.bucket_batch_size, 4);
  EXPECT_EQ(r.band, 3);
  EXPECT_TRUE(w.check_layer(ex, 0));
}

TEST(BandSelectDevice, DeviceInputsNeedNoHintAndNoCopy) {
  World w(spec(DType::kBFloat16), 1, 8, 4096, 151);
  ExecutorConfig c = w.config(8, 4096);
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  for (int k = 0; k < 4; ++k) {
    w.set_lens({1 + 1000 * k, 17, 4096 - k});
    w.fill_step(ex);
    StepInputs in = w.inputs();
    in.space = MemorySpace::kDevice;  // host memory here, read as the device would
    const StepResult r = ex.step(in);
    EXPECT_TRUE(r.band_on_device);
    EXPECT_EQ(r.band, -1) << "not known on the host";
    EXPECT_TRUE(w.check_layer(ex, 0)) << "step " << k;
    EXPECT_TRUE(w.check_appended(ex, 0));
  }
  EXPECT_EQ(ex.stats().input_downloads, 0);
  // With a hint it still reads nothing; the graph picks the band of the real lengths.
  w.set_lens({700, 90});
  w.fill_step(ex);
  StepInputs in = w.inputs();
  in.space = MemorySpace::kDevice;
  in.max_seq_len = 4000;
  ex.step(in);
  EXPECT_TRUE(w.check_layer(ex, 0));
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.input_downloads, 0);
  ASSERT_EQ(st.graphs.size(), 2u);  // buckets 4 and 2
  long long band1 = 0;
  for (const GraphStats& g : st.graphs)
    if (g.batch == 2) band1 = g.band_replays.at(1);
  EXPECT_EQ(band1, 1) << "700 tokens is band (512, 1024], whatever the hint";
  // kFull still copies device inputs back to check them.
  ExecutorConfig cf = c;
  cf.validation = ValidationLevel::kFull;
  Executor full(cf);
  w.fill_step(full);
  in.max_seq_len = 0;
  full.step(in);
  EXPECT_GT(full.stats().input_downloads, 0);
  EXPECT_TRUE(w.check_layer(full, 0));
}

TEST(BandSelectDevice, FallsBackToKHostWithAMessageWhenTheProbeFails) {
  World w(spec(), 1, 4, 2048, 161);
  ExecutorConfig c = w.config(4, 2048);
  c.switch_probe = [] { return false; };  // a driver without conditional nodes
  Executor ex(c);  // never a failure
  EXPECT_EQ(ex.band_select(), BandSelect::kHost);
  const ExecutorStats st0 = ex.stats();
  EXPECT_EQ(st0.band_select, BandSelect::kHost);
  EXPECT_NE(st0.band_select_note.find("switch_probe"), std::string::npos) << st0.band_select_note;
  w.set_lens({1500, 3});
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());
  EXPECT_FALSE(r.band_on_device);
  EXPECT_EQ(r.band, 2);
  EXPECT_EQ(r.graph_id, ex.plan_for(r).graph_id) << "kHost's graph of the plan";
  EXPECT_TRUE(w.check_layer(ex, 0));
  // A probe that passes keeps kDevice.
  c.switch_probe = [] { return true; };
  EXPECT_EQ(Executor(c).band_select(), BandSelect::kDevice);
}

TEST(BandSelectDevice, RebindLayersUpdatesTheBucketGraphs) {
  World w(spec(), 2, 4, 2048, 171), fresh(spec(), 2, 4, 2048, 172);
  Executor ex(w.config(4, 2048));
  w.set_lens({1500, 20});
  w.fill_step(ex);
  ex.step(w.inputs());
  ASSERT_TRUE(w.check_layer(ex, 1));
  ExecutorConfig fc = fresh.config(4, 2048);
  ex.rebind_layers(fc.layers);
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.graph_updates, 1);
  EXPECT_EQ(st.total_captures, 1);
  fresh.set_lens({300, 2000});
  fresh.fill_step(ex);
  EXPECT_FALSE(ex.step(fresh.inputs()).captured);
  EXPECT_TRUE(fresh.check_layer(ex, 0));
  EXPECT_TRUE(fresh.check_layer(ex, 1));
  EXPECT_TRUE(fresh.check_appended(ex, 1));
}

TEST(BandSelectDevice, StepBodyPlanSpansTheBucketAndAttentionCallsAreBounded) {
  World w(spec(), 1, 4, 2048, 181);
  ExecutorConfig c = w.config(4, 2048);
  std::vector<BucketPlan> seen;
  int calls = 1;
  Executor ex(c, [&](StepContext& ctx) {
    seen.push_back(ctx.plan());
    ctx.append_kv(0);
    for (int i = 0; i < calls; ++i) ctx.attention(0);
  });
  w.set_lens({100, 30});
  w.fill_step(ex);
  ex.step(w.inputs());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].batch, 2);
  EXPECT_EQ(seen[0].band_lo, 0);
  EXPECT_EQ(seen[0].band_hi, 2048);
  EXPECT_GE(seen[0].launch_len, 2048);
  EXPECT_TRUE(w.check_layer(ex, 0));
  // A body with more attention calls than SWITCH handles is rejected, naming the limit.
  calls = kernels::kMaxSwitchHandles + 1;
  w.set_lens({100, 30, 5, 9});
  w.fill_step(ex);
  try {
    ex.step(w.inputs());
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("at most 256"), std::string::npos) << e.what();
  }
  calls = 1;
  w.fill_step(ex);
  EXPECT_TRUE(ex.step(w.inputs()).captured) << "usable: the bucket captures on the next step";
  EXPECT_TRUE(w.check_layer(ex, 0));
}

TEST(BandSelectDevice, MeasuredMeasuresEveryBandOfTheBucketOnItsFirstStep) {
  World w(spec(), 1, 4, 2048, 191);
  ExecutorConfig c = w.config(4, 2048);  // bands 512 1024 2048
  c.policy = KernelPolicy::kMeasured;
  // V2 at the candidate's size always wins (deterministic), so every band ends up V2.
  c.measure_clock = [](const BucketPlan&, const PlanCandidate& k) { return k.kernel == KernelKind::kV2 ? 1.0 : 5.0; };
  Executor ex(c);
  w.set_lens({100, 7});
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());
  EXPECT_TRUE(r.measured);
  EXPECT_TRUE(r.captured);
  EXPECT_TRUE(w.check_layer(ex, 0));
  for (int band = 0; band < 3; ++band) {
    const BucketPlan& p = ex.plan_for_batch(2, band);
    EXPECT_EQ(p.reason, PlanReason::kMeasuredFastest) << band;
    EXPECT_EQ(p.kernel, KernelKind::kV2) << band;
  }
  EXPECT_EQ(ex.stats().measured_buckets, 3);
  w.set_lens({1900, 7});
  w.fill_step(ex);
  const StepResult r2 = ex.step(w.inputs());
  EXPECT_FALSE(r2.measured);
  EXPECT_FALSE(r2.captured);
  EXPECT_TRUE(w.check_layer(ex, 0));
}

TEST(BandSelectDevice, HostStagingAndTheCallersStreamWork) {
  World w(spec(), 1, 4, 2048, 201);
  Executor ex(w.config(4, 2048));
  for (const int longest : {2048, 300}) {
    w.set_lens({longest, 5});
    w.fill_step(ex);
    ex.step(inputs_in_host_staging(ex, w), Stream{nullptr});
    EXPECT_TRUE(w.check_layer(ex, 0)) << longest;
  }
  EXPECT_EQ(ex.stats().staging_copy_bytes, 0);
  EXPECT_EQ(ex.stats().total_captures, 1);
}

// kMeasured times every band of a kDevice bucket on synthetic inputs staged through the pinned
// mirrors, during the first step; inputs the caller wrote into host_staging() for that very step
// live in those mirrors and must survive it (the fuzzer found them replaced by the synthetic step).
TEST(BandSelectDevice, MeasuringOnTheFirstStepKeepsInputsWrittenIntoHostStaging) {
  World w(spec(DType::kFloat16), 1, 4, 2048, 211);
  ExecutorConfig c = w.config(4, 2048);
  c.policy = KernelPolicy::kMeasured;
  c.capture = CapturePolicy::kLazy;
  c.measure_replays = 1;
  Executor ex(c);
  for (const int longest : {1500, 600}) {
    w.set_lens({longest, 33, 7});
    w.fill_step(ex);
    // The buffers written for this step: host_staging() after it hands out the next set (the ring).
    HostStaging h;
    const StepResult r = ex.step(inputs_in_host_staging(ex, w, &h));
    EXPECT_EQ(r.measured, longest == 1500) << "the bucket is measured on its first step only";
    EXPECT_TRUE(w.check_layer(ex, 0)) << longest;
    // The mirrors still hold what the caller wrote.
    EXPECT_TRUE(std::equal(w.lens.begin(), w.lens.end(), h.seq_lens.begin())) << longest;
    EXPECT_TRUE(std::equal(w.tables.begin(), w.tables.begin() + w.stride, h.block_tables.begin())) << longest;
  }
}

TEST(BandSelectDevice, CaptureFiguresSideBySide) {
  // Graph counts under both modes for one config; the kDevice bucket graphs hold every band.
  World w(spec(), 2, 8, 16384, 211);
  ExecutorConfig c = w.config(8, 16384);
  c.capture = CapturePolicy::kUpFront;
  c.band_select = BandSelect::kHost;
  Executor host(c);
  c.band_select = BandSelect::kDevice;
  Executor dev(c);
  const ExecutorStats sh = host.stats(), sd = dev.stats();
  EXPECT_EQ(sd.distinct_graphs, static_cast<int>(c.batch_buckets.empty() ? 4 : c.batch_buckets.size()));
  EXPECT_EQ(static_cast<int>(sh.graphs.size()), sh.distinct_graphs);
  EXPECT_EQ(sd.distinct_plans, sh.distinct_graphs);
  EXPECT_GT(sh.graphs.size(), sd.graphs.size());
  int host_nodes = 0, dev_nodes = 0;
  for (const GraphStats& g : sh.graphs) host_nodes += g.nodes;
  for (const GraphStats& g : sd.graphs) dev_nodes += g.nodes;
  EXPECT_GT(dev_nodes, 0);
  EXPECT_GT(host_nodes, 0);
}

}  // namespace
