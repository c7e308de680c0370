// The host path of a step (issues 19 and 20), on the host backend:
//  - an engine's own graph capture: step() on a stream the caller is capturing records its staging
//    copies and its graph's work into that capture (executor/host_capture.hpp models it on the
//    CPU); the caller's graph is then replayed for several decode steps whose lengths cross a band
//    edge, under both band choices, against the float64 reference and bitwise against the kHost
//    graph of the band; what cannot be recorded is an InvalidArgument that records nothing;
//  - the device guard: every entry point binds the executor's device and gives it back, and every
//    backend operation runs bound (the host backend counts both);
//  - the pinned staging ring: while copies are in flight consecutive steps stage through different
//    slots, so the host never waits for the copies of the step just before; once they are done the
//    last slot is reused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "exec_world.hpp"
#include "executor/backend.hpp"
#include "executor/config_checks.hpp"
#include "executor/device_guard.hpp"
#include "executor/host_capture.hpp"
#include "executor/memory.hpp"
#include "executor/staging.hpp"

namespace {
using namespace decodegraph;
using detail::HostStreamCapture;
using dgtest::World;

AttentionSpec spec(DType dtype = DType::kFloat32) { return dgtest::small_spec(dtype); }

using dgtest::rejects;

// The caller's fixed "device" input buffers (host memory on the host backend): allocated once, at
// addresses the captured copies read at every replay, refilled by the caller before each one.
struct FixedInputs {
  std::vector<int32_t> lens, tables;
  std::vector<int64_t> slots;
  int stride = 0;
  FixedInputs(const World& w, int rows) : lens(rows), tables(static_cast<std::size_t>(rows) * w.stride), slots(rows), stride(w.stride) {}
  /// Copies the world's current inputs in (their row count must be the capture's).
  void fill(const World& w) {
    ASSERT_EQ(w.lens.size(), lens.size());
    std::copy(w.lens.begin(), w.lens.end(), lens.begin());
    std::copy(w.tables.begin(), w.tables.end(), tables.begin());
    std::copy(w.slots.begin(), w.slots.end(), slots.begin());
  }
  StepInputs inputs(int hint = 0) const {
    StepInputs in;
    in.num_seqs = static_cast<int>(lens.size());
    in.seq_lens = lens.data();
    in.block_tables = tables.data();
    in.block_table_stride = stride;
    in.slot_mapping = slots.data();
    in.space = MemorySpace::kDevice;
    in.max_seq_len = hint;
    return in;
  }
};

ExecutorConfig capture_config(World& w, int max_batch, int max_len, BandSelect band) {
  ExecutorConfig c = w.config(max_batch, max_len);
  c.validation = ValidationLevel::kCheap;  // kFull cannot run inside a capture
  c.band_select = band;
  c.policy = KernelPolicy::kThreshold;
  c.v2_threshold = 1024;  // bands 512, 1024 (V1) and 2048 (V2)
  c.append_kv = false;    // the caches stay fixed: the kHost executor reads the same data
  return c;
}

// The kernel the caller's graph runs for its attention at this replay (dgtest::failing_kernel).
std::string kernel_replayed(const HostStreamCapture& cap, int skip) {
  return dgtest::failing_kernel([&] { cap.replay(); }, skip);
}

// Records one decode step of `rows` sequences into a fresh capture the way an engine would: its own
// work first (writing q), then step(), then its own work reading the output.
struct CallerGraph {
  HostStreamCapture cap;
  FixedInputs fixed;
  std::vector<char> q_next, out_seen;
  StepResult r;
  CallerGraph(Executor& ex, const World& w, int rows, int hint) : fixed(w, rows) {
    const std::size_t qb = w.q_elems(rows) * dtype_size(w.spec.dtype);
    q_next.resize(qb);
    out_seen.resize(qb);
    void* q = ex.query(0);
    const void* out = ex.output(0);
    cap.record([this, q, qb] { std::memcpy(q, q_next.data(), qb); });  // "the QKV GEMM"
    r = ex.step(fixed.inputs(hint), cap.stream());
    cap.record([this, out, qb] { std::memcpy(out_seen.data(), out, qb); });  // "the next layer"
    cap.end();
  }
};

// Under kDevice the caller's graph holds the band-select node and the SWITCH nodes: each replay
// runs the band its lengths fall in, crossing 1024 (V1 -> V2) both ways, bitwise equal to the kHost
// executor's graph of that band and within tolerance of the reference. Two captures (batch buckets
// 2 and 4) replay in turn; no graph of the executor's is ever captured.
TEST(CallerCapture, KDeviceReplaysRunTheBandOfEachReplaysLengths) {
  World w(spec(), 1, 4, 2048, 301);
  Executor ex(capture_config(w, 4, 2048, BandSelect::kDevice));
  ASSERT_EQ(ex.band_select(), BandSelect::kDevice);
  Executor host(capture_config(w, 4, 2048, BandSelect::kHost));
  CallerGraph two(ex, w, 2, 0), four(ex, w, 4, 0);
  EXPECT_TRUE(two.r.in_caller_capture);
  EXPECT_TRUE(two.r.band_on_device);
  EXPECT_FALSE(two.r.captured);
  EXPECT_EQ(two.r.band, -1) << "device inputs without a hint: the band is chosen at each replay";
  EXPECT_EQ(two.r.bucket_batch_size, 2);
  EXPECT_EQ(four.r.bucket_batch_size, 4);
  ExecutorStats st = ex.stats();
  EXPECT_EQ(st.total_captures, 0);
  EXPECT_EQ(st.caller_captures, 2);
  EXPECT_EQ(st.input_downloads, 0);

  const std::vector<std::vector<int>> steps = {{1000, 5},           {1030, 17},          {7, 2048, 600, 1},
                                               {700, 3, 9, 1024},   {1025, 1, 1, 1},     {300, 2}};
  for (const std::vector<int>& lens : steps) {
    const int longest = *std::max_element(lens.begin(), lens.end());
    const char* want = longest <= 1024 ? "v1" : "v2";
    CallerGraph& g = lens.size() == 2 ? two : four;
    w.set_lens(lens);
    g.fixed.fill(w);
    dgtest::fill_uniform(w.spec.dtype, g.q_next.data(), w.q_elems(static_cast<int>(lens.size())), w.rng);
    EXPECT_EQ(kernel_replayed(g.cap, /*skip=*/1), want) << "longest " << longest;  // band select, then attention
    g.cap.replay();
    // The kHost executor's graph of this band, on the same q.
    std::memcpy(host.query(0), g.q_next.data(), g.q_next.size());
    const StepResult rh = host.step(w.inputs());
    EXPECT_EQ(to_string(rh.kernel), std::string(want));
    EXPECT_EQ(std::memcmp(g.out_seen.data(), host.output(0), g.out_seen.size()), 0)
        << "the caller's graph differs from the kHost graph of its band, longest " << longest;
    const std::vector<double> ref = w.reference(0, g.q_next.data());
    const dgtest::Tol t = dgtest::tol_for(w.spec.dtype);
    EXPECT_TRUE(dgtest::check_close(w.spec.dtype, g.out_seen.data(), ref.data(), static_cast<int>(lens.size()),
                                    w.spec.num_q_heads, w.spec.head_size, t.atol, t.rtol))
        << "longest " << longest;
  }
  st = ex.stats();
  EXPECT_EQ(st.total_captures, 0) << "replays of the caller's graph never capture a graph of ours";
  EXPECT_EQ(st.steps, 2);
  // The executor still runs steps of its own afterwards.
  w.set_lens({900, 1500});
  w.fill_step(ex);
  EXPECT_FALSE(ex.step(w.inputs()).in_caller_capture);
  EXPECT_TRUE(w.check_layer(ex, 0));
}

// Under kHost the caller's graph holds the launches of the hint's band: a hint of 2048 records V2,
// which every replay then runs, right for every length up to the hint (lower bands included).
TEST(CallerCapture, KHostRecordsTheHintsBandAndServesEveryLengthBelowIt) {
  World w(spec(), 1, 4, 2048, 307);
  Executor ex(capture_config(w, 4, 2048, BandSelect::kHost));
  CallerGraph g(ex, w, 3, /*hint=*/2048);
  EXPECT_TRUE(g.r.in_caller_capture);
  EXPECT_EQ(g.r.kernel, KernelKind::kV2);
  EXPECT_EQ(g.r.band_hi, 2048);
  for (const std::vector<int>& lens : {std::vector<int>{2048, 3, 70}, std::vector<int>{100, 1, 1000},
                                       std::vector<int>{1025, 1024, 1023}}) {
    w.set_lens(lens);
    g.fixed.fill(w);
    dgtest::fill_uniform(w.spec.dtype, g.q_next.data(), w.q_elems(3), w.rng);
    EXPECT_EQ(kernel_replayed(g.cap, /*skip=*/0), "v2");
    g.cap.replay();
    const std::vector<double> ref = w.reference(0, g.q_next.data());
    const dgtest::Tol t = dgtest::tol_for(w.spec.dtype);
    EXPECT_TRUE(dgtest::check_close(w.spec.dtype, g.out_seen.data(), ref.data(), 3, w.spec.num_q_heads,
                                    w.spec.head_size, t.atol, t.rtol))
        << "lengths " << lens[0] << ", " << lens[1] << ", " << lens[2];
  }
  EXPECT_EQ(ex.stats().total_captures, 0);
}

// The KV append is recorded too: each replay appends the new K/V the caller wrote at that replay's
// slots, and attends over them. Two layers, kDevice, lengths growing one token per replay across 512.
TEST(CallerCapture, AppendAndAttentionOfEveryLayerRunAtEachReplay) {
  World w(spec(DType::kFloat16), 2, 2, 1024, 311);
  ExecutorConfig c = capture_config(w, 2, 1024, BandSelect::kDevice);
  c.append_kv = true;
  Executor ex(c);
  HostStreamCapture cap;
  FixedInputs fixed(w, 2);
  ex.step(fixed.inputs(), cap.stream());
  cap.end();
  for (int len = 509; len <= 514; ++len) {
    w.set_lens({len, 1 + (len - 509) * 37});
    fixed.fill(w);
    w.fill_step(ex);  // q and the new K/V, in the executor's buffers the graph reads
    cap.replay();
    for (int l = 0; l < 2; ++l) {
      EXPECT_TRUE(w.check_appended(ex, l)) << "layer " << l << " len " << len;
      EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l << " len " << len;
    }
  }
}

// A step body runs inside the caller's capture: StepContext::stream() is the caller's stream, and
// the body's own work lands in the caller's graph in order.
TEST(CallerCapture, AStepBodyRecordsIntoTheCallersGraph) {
  World w(spec(), 1, 2, 1024, 313);
  std::vector<int> order;
  Stream seen = nullptr;
  Executor ex(capture_config(w, 2, 1024, BandSelect::kDevice), [&](StepContext& ctx) {
    seen = ctx.stream();
    ctx.enqueue_host([&] { order.push_back(1); });
    ctx.attention(0);
    ctx.enqueue_host([&] { order.push_back(2); });
  });
  HostStreamCapture cap;
  FixedInputs fixed(w, 2);
  cap.record([&] { order.push_back(0); });
  ex.step(fixed.inputs(), cap.stream());
  cap.record([&] { order.push_back(3); });
  cap.end();
  EXPECT_EQ(seen, cap.stream());
  EXPECT_TRUE(order.empty()) << "nothing runs while it is recorded";
  w.set_lens({600, 3});
  fixed.fill(w);
  w.fill_step(ex);
  cap.replay();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(w.check_layer(ex, 0));
}

// What cannot be recorded into a capture is refused before anything is recorded, saying what to do
// instead; the capture and the executor stay usable.
TEST(CallerCapture, WhatCannotBeRecordedIsRefusedAndRecordsNothing) {
  World w(spec(), 1, 4, 2048, 317);
  ExecutorConfig c = capture_config(w, 4, 2048, BandSelect::kHost);
  Executor host_mode(c);
  c.validation = ValidationLevel::kFull;
  Executor full(c);
  c.validation = ValidationLevel::kCheap;
  c.policy = KernelPolicy::kMeasured;
  c.band_select = BandSelect::kDevice;
  c.measure_replays = 1;
  Executor measured(c);
  HostStreamCapture cap;
  FixedInputs fixed(w, 2);
  w.set_lens({100, 1500});
  fixed.fill(w);
  StepInputs host_in = w.inputs();
  EXPECT_TRUE(rejects([&] { host_mode.step(host_in, cap.stream()); }, {"inputs.space", "kDevice", "every replay"}));
  EXPECT_TRUE(rejects([&] { full.step(fixed.inputs(2048), cap.stream()); }, {"validation", "kFull", "kCheap"}));
  EXPECT_TRUE(rejects([&] { host_mode.step(fixed.inputs(), cap.stream()); },
                      {"inputs.max_seq_len", "no hint", "BandSelect::kDevice"}));
  EXPECT_TRUE(rejects([&] { measured.step(fixed.inputs(), cap.stream()); }, {"policy", "kMeasured", "capture_all()"}));
  EXPECT_EQ(cap.nodes(), 0) << "a refused step recorded something";
  EXPECT_EQ(host_mode.stats().rejected_steps, 2);

  // Measured first (here by capture_all), the same step is recorded; the others work with a hint.
  measured.capture_all();
  EXPECT_TRUE(measured.step(fixed.inputs(), cap.stream()).in_caller_capture);
  EXPECT_TRUE(host_mode.step(fixed.inputs(2048), cap.stream()).in_caller_capture);
  EXPECT_GT(cap.nodes(), 0);
  cap.end();
  EXPECT_FALSE(HostStreamCapture::find(cap.stream())) << "an ended capture is an ordinary stream again";
  w.fill_step(host_mode);
  host_mode.step(w.inputs(), cap.stream());  // runs now: the stream is no longer captured
  EXPECT_TRUE(w.check_layer(host_mode, 0));
}

// kCheap inside a capture: a bad block id at a replay is clamped there and reported by the next step
// outside the capture (or check_errors()); a step recorded while the report is pending does not
// throw it (reporting may wait, which a capture cannot).
TEST(CallerCapture, ABadBlockIdAtAReplayIsReportedOutsideTheCapture) {
  World w(spec(), 1, 2, 1024, 331);
  Executor ex(capture_config(w, 2, 1024, BandSelect::kDevice));
  HostStreamCapture cap;
  FixedInputs fixed(w, 2);
  ex.step(fixed.inputs(), cap.stream());
  cap.end();
  w.set_lens({300, 40});
  fixed.fill(w);
  fixed.tables[w.stride + 1] = w.num_blocks + 5;  // sequence 1, column 1: past the cache
  w.fill_step(ex);
  cap.replay();
  HostStreamCapture second;
  EXPECT_NO_THROW(ex.step(fixed.inputs(), second.stream())) << "the pending report must wait for a step outside";
  second.end();
  EXPECT_TRUE(rejects([&] { ex.check_errors(); }, {"inputs.block_tables[1][1]"}));
  EXPECT_NO_THROW(ex.check_errors());
}

// ---------------------------------------------------------------- the device guard

// Every entry point that reaches the backend opens the device guard (counted by the host backend),
// closes it before it returns or throws, and no backend operation runs outside one.
TEST(DeviceGuard, EveryEntryPointBindsTheDeviceAndEveryOperationRunsBound) {
  World w(spec(), 1, 4, 1024, 337);
  const detail::HostDeviceGuardCounts start = detail::host_device_guard_counts();
  auto entered_by = [](const std::function<void()>& fn) {
    const detail::HostDeviceGuardCounts before = detail::host_device_guard_counts();
    try {
      fn();
    } catch (const Error&) {
    }
    const detail::HostDeviceGuardCounts after = detail::host_device_guard_counts();
    EXPECT_EQ(after.entered, after.left) << "a guard was left open";
    return after.entered - before.entered;
  };
  ExecutorConfig c = w.config(4, 1024);
  auto ex = std::make_unique<Executor>(c);
  EXPECT_GT(entered_by([&] { ex = std::make_unique<Executor>(c); }), 1) << "construction (and the old one's teardown)";
  w.set_lens({100, 700});
  w.fill_step(*ex);
  EXPECT_GT(entered_by([&] { ex->step(w.inputs()); }), 0) << "step";
  EXPECT_GT(entered_by([&] { ex->step(w.inputs(), Stream{nullptr}); }), 0) << "step on a stream";
  StepInputs bad = w.inputs();
  bad.num_seqs = 0;
  EXPECT_GT(entered_by([&] { ex->step(bad); }), 0) << "a rejected step";
  EXPECT_GT(entered_by([&] { (void)ex->host_staging(); }), 0) << "host_staging";
  EXPECT_GT(entered_by([&] { ex->check_errors(); }), 0) << "check_errors";
  EXPECT_GT(entered_by([&] { ex->capture_all(); }), 0) << "capture_all";
  EXPECT_GT(entered_by([&] { ex->rebind_layers(ex->config().layers); }), 0) << "rebind_layers";
  EXPECT_GT(entered_by([&] { (void)ex->stats(); }), 0) << "stats";
  EXPECT_GT(entered_by([&] { (void)ex->memory(); }), 0) << "memory";
  {
    ExecutorConfig cc = capture_config(w, 4, 1024, BandSelect::kDevice);
    Executor inside(cc);
    HostStreamCapture cap;
    FixedInputs fixed(w, 2);
    EXPECT_GT(entered_by([&] { inside.step(fixed.inputs(), cap.stream()); }), 0) << "a step into a capture";
    cap.end();
  }
  auto other = std::make_unique<Executor>(c);
  EXPECT_GT(entered_by([&] { *other = std::move(*ex); }), 0) << "move assignment tears the old executor down";
  EXPECT_GT(entered_by([&] { other.reset(); }), 0) << "destruction";
  const detail::HostDeviceGuardCounts end = detail::host_device_guard_counts();
  EXPECT_EQ(end.unbound_ops, start.unbound_ops) << "a backend operation ran outside the device guard";
  EXPECT_EQ(end.entered, end.left);
}

// ---------------------------------------------------------------- the staging ring

struct RingRig {
  std::unique_ptr<detail::Backend> backend = detail::make_host_backend();
  detail::Allocations memory{*backend};
  ExecutorConfig cfg;
  explicit RingRig() {
    cfg.spec = spec();
    cfg.max_batch = 4;
    cfg.max_seq_len = 256;
    cfg.num_blocks = 64;
    cfg.validation = ValidationLevel::kCheap;
    cfg.append_kv = false;  // the pinned step below passes no slots
    cfg.max_blocks_per_seq = 16;
    cfg = detail::resolve_planning(cfg);
  }
};

/// While set, the host backend reports every slot's copies as still in flight (a device running behind).
struct CopiesPending {
  CopiesPending() { detail::set_host_staging_copies_pending(true); }
  ~CopiesPending() { detail::set_host_staging_copies_pending(false); }
};

StepInputs ring_inputs(std::vector<int32_t>& lens, std::vector<int32_t>& tables, std::vector<int64_t>& slots) {
  StepInputs in;
  in.num_seqs = 2;
  in.seq_lens = lens.data();
  in.block_tables = tables.data();
  in.block_table_stride = 16;
  in.slot_mapping = slots.data();
  return in;
}

// While the device runs behind (every slot's copies in flight), steps stage through the slots in
// turn, so no step waits for the copies of the step just before it (each waits for those of two
// steps back); host_staging() hands out the next step's slot and stays with it until a step. Once
// the copies are done, the last step's slot is reused (no wait, still in the CPU's cache).
TEST(StagingRing, StepsRotateWhileCopiesAreInFlightAndReuseTheSlotOnceDone) {
  RingRig r;
  detail::StepStaging s(r.cfg, BandSelect::kHost, *r.backend, r.memory);
  std::vector<int32_t> lens = {20, 3}, tables(2 * 16, 1);
  std::vector<int64_t> slots = {-1, -1};
  const StepInputs in = ring_inputs(lens, tables, slots);
  std::vector<const int32_t*> used;
  {
    CopiesPending pending;
    for (int k = 0; k < 6; ++k) {
      const HostStaging h = s.host_staging();
      EXPECT_EQ(s.host_staging().seq_lens.data(), h.seq_lens.data()) << "no step in between: the same slot";
      lens[0] = 100 + k;
      s.stage(in, 2, s.validate(in).band_len);  // the caller's arrays: copied into the handed-out slot
      EXPECT_EQ(h.seq_lens[0], 100 + k) << "step " << k << " staged through the slot handed out for it";
      used.push_back(h.seq_lens.data());
    }
  }
  for (int k = 1; k < 6; ++k) EXPECT_NE(used[k], used[k - 1]) << "step " << k << " reused the previous step's slot";
  for (int k = 3; k < 6; ++k) EXPECT_EQ(used[k], used[k - 3]) << "three slots in turn";
  EXPECT_NE(used[2], used[0]);
  // Copies done: the last step's slot again, step after step.
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(s.host_staging().seq_lens.data(), used[5]);
    s.stage(in, 2, s.validate(in).band_len);
  }
  // Each of the nine steps copied 2 lengths, 2 slots and 2 rows of the 7 columns 105 tokens need.
  EXPECT_EQ(s.copy_bytes(), 9 * (2 * 4 + 2 * 8 + 2 * 7 * 4));
}

// kMeasured's synthetic staging never touches the slot holding the step's inputs nor the one handed
// out for the next step, with the copies in flight or done; inputs still pointing at an earlier
// hand-out are staged from it; inputs split over two slots are refused.
TEST(StagingRing, SyntheticStagingUsesNeitherTheStepsSlotNorTheNextOne) {
  for (const bool in_flight : {true, false}) {
    RingRig r;
    detail::StepStaging s(r.cfg, BandSelect::kHost, *r.backend, r.memory);
    detail::set_host_staging_copies_pending(in_flight);
    std::vector<int32_t> lens = {20, 3}, tables(2 * 16, 1);
    std::vector<int64_t> slots = {-1, -1};
    const StepInputs in = ring_inputs(lens, tables, slots);
    s.stage(in, 2, s.validate(in).band_len);
    HostStaging h = s.host_staging();
    h.seq_lens[0] = 77;
    h.seq_lens[1] = 5;
    std::copy_n(tables.begin(), 2 * 16, h.block_tables.begin());
    BucketPlan synthetic;
    synthetic.batch = 4;
    synthetic.band_lo = 128;
    synthetic.band_hi = 256;
    s.stage_synthetic(synthetic);  // before the step (capture_all)
    EXPECT_EQ(h.seq_lens[0], 77) << "in flight " << in_flight;
    EXPECT_EQ(s.host_staging().seq_lens.data(), h.seq_lens.data()) << "synthetic staging moved the next slot";
    StepInputs pinned = in;
    pinned.seq_lens = h.seq_lens.data();
    pinned.block_tables = h.block_tables.data();
    pinned.block_table_stride = h.block_table_stride;
    pinned.slot_mapping = nullptr;
    s.stage(pinned, 2, s.validate(pinned).band_len);
    EXPECT_EQ(s.device().seq_lens[0], 77);
    const HostStaging next = s.host_staging();  // picked before the synthetic staging below
    // Copies done: the next step reuses the last step's slot; in flight: another one.
    EXPECT_EQ(next.seq_lens.data() == h.seq_lens.data(), !in_flight);
    if (in_flight) next.seq_lens[0] = 99;
    s.stage_synthetic(synthetic);  // within the step (kMeasured on its first step)
    EXPECT_EQ(h.seq_lens[0], 77) << "the step's slot, in flight " << in_flight;
    if (in_flight) EXPECT_EQ(next.seq_lens[0], 99) << "the next step's slot";
    // A stale hand-out is staged from where it is.
    s.stage(pinned, 2, s.validate(pinned).band_len);
    EXPECT_EQ(s.device().seq_lens[0], 77);
    StepInputs split = pinned;
    CopiesPending pending;  // the next slot differs from the stale one
    split.block_tables = s.host_staging().block_tables.data();
    if (split.block_tables != pinned.block_tables)
      EXPECT_TRUE(rejects([&] { s.validate(split); }, {"inputs.block_tables", "of the same host_staging() call"}));
    else
      ADD_FAILURE() << "the next slot is the stale one's although its copies are in flight";
    detail::set_host_staging_copies_pending(false);
  }
}

// End to end: inputs written into each hand-out in turn are never copied and always right.
TEST(StagingRing, AnEngineLoopThroughHostStagingCopiesNothing) {
  World w(spec(DType::kFloat16), 1, 4, 1024, 347);
  Executor ex(w.config(4, 1024));
  for (int k = 0; k < 7; ++k) {
    w.set_lens({100 + 150 * k, 1 + k, 17});
    w.fill_step(ex);
    const HostStaging h = ex.host_staging();
    std::copy(w.lens.begin(), w.lens.end(), h.seq_lens.begin());
    std::copy(w.slots.begin(), w.slots.end(), h.slot_mapping.begin());
    for (int i = 0; i < 3; ++i)
      std::copy_n(w.tables.begin() + static_cast<std::ptrdiff_t>(i) * w.stride, std::min(w.stride, h.block_table_stride),
                  h.block_tables.begin() + static_cast<std::ptrdiff_t>(i) * h.block_table_stride);
    StepInputs in = w.inputs();
    in.seq_lens = h.seq_lens.data();
    in.block_tables = h.block_tables.data();
    in.block_table_stride = h.block_table_stride;
    in.slot_mapping = h.slot_mapping.data();
    ex.step(in);
    EXPECT_TRUE(w.check_layer(ex, 0)) << "step " << k;
    EXPECT_TRUE(w.check_appended(ex, 0)) << "step " << k;
  }
  EXPECT_EQ(ex.stats().staging_copy_bytes, 0);
}

}  // namespace
