// GPU executor tests (skip without a device): graph replay against the float64 reference, graph
// output bitwise equal to the eager launchers' output, and two replays of the same inputs bitwise
// equal, for a V1 and a V2 bucket and for a bucket kMeasured chose by timing candidates with events.
// Then the engine-facing paths (issue 11) on a real device: steps on the caller's streams in turn,
// caches smaller than the spec (the driver's address range), a bad block id under kCheap, device
// inputs with a max_seq_len hint, and rebind_layers. Outputs are compared where they are, on the
// device (tests/gpu/device_compare.hpp): bitwise, or against the float64 reference copied over.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"

#include "exec_world.hpp"

#if DECODEGRAPH_HAS_CUDA
#include <cuda_runtime.h>

#include "device_compare.hpp"
#endif

namespace {
using namespace decodegraph;
using dgtest::World;

#if DECODEGRAPH_HAS_CUDA
#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(std::size_t n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
};
#endif

// kind: the kernel the threshold policy gives the bucket; measured: let kMeasured choose instead.
void run_gpu_case(KernelKind kind, bool measured = false) {
#if DECODEGRAPH_HAS_CUDA
  AttentionSpec s;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.head_size = 128;
  s.dtype = DType::kBFloat16;
  const int max_len = 4096;
  World w(s, 1, 8, max_len, 77);
  const std::size_t cache_bytes = w.k[0].bytes;
  DevBuf dk(cache_bytes), dv(cache_bytes);
  CK(cudaMemcpy(dk.p, w.k[0].data(), cache_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv.p, w.v[0].data(), cache_bytes, cudaMemcpyHostToDevice));
  ExecutorConfig c = w.config(8, max_len);
  c.layers[0].k_cache = dk.p;
  c.layers[0].v_cache = dv.p;
  c.backend = BackendKind::kCuda;
  c.v2_threshold = 1024;
  c.policy = measured ? KernelPolicy::kMeasured : KernelPolicy::kThreshold;  // threshold: both kernels
  c.append_kv = false;  // the cache stays fixed, so eager and graph see the same data
  Executor ex(c);
  const int lo = kind == KernelKind::kV1 ? 1 : 1025, hi = kind == KernelKind::kV1 ? 1024 : max_len;
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int> lens(7);
  for (int& l : lens) l = d(w.rng);
  lens[0] = hi;
  w.set_lens(lens);
  const std::size_t qb = w.q_elems(7) * dtype_size(s.dtype);
  std::vector<char> q(qb);
  dgtest::fill_uniform(s.dtype, q.data(), w.q_elems(7), w.rng);
  CK(cudaMemcpy(ex.query(0), q.data(), qb, cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());  // a pageable cudaMemcpy may return before the DMA lands
  const StepResult r = ex.step(w.inputs());
  if (measured) {
    // Every candidate was timed with CUDA events (a positive time) and the fastest kept.
    const BucketPlan& p = ex.plan_for(r);
    EXPECT_TRUE(r.measured);
    EXPECT_EQ(p.reason, PlanReason::kMeasuredFastest);
    ASSERT_GE(p.candidates.size(), 2u);
    double best = p.candidates[0].us;
    for (const PlanCandidate& cand : p.candidates) {
      EXPECT_GT(cand.us, 0.0);
      best = std::min(best, cand.us);
    }
    for (const PlanCandidate& cand : p.candidates)
      if (cand.kernel == p.kernel && cand.partition_size == p.partition_size) EXPECT_EQ(cand.us, best);
    EXPECT_GT(ex.stats().measure_ms, 0.0);
  } else {
    ASSERT_EQ(r.kernel, kind);
  }
  CK(cudaStreamSynchronize(ex.stream()));
  DevBuf g1(qb);  // the first replay's output, kept on the device
  CK(cudaMemcpy(g1.p, ex.output(0), qb, cudaMemcpyDeviceToDevice));
  ex.step(w.inputs());
  CK(cudaStreamSynchronize(ex.stream()));
  EXPECT_TRUE(dgtest::bitwise_equal_on_device(g1.p, ex.output(0), qb)) << "two replays differ";

  std::vector<double> ref = w.reference(0, q.data());
  const dgtest::Tol t = dgtest::tol_for(s.dtype);
  EXPECT_TRUE(dgtest::check_close_on_device(s.dtype, g1.p, ref, 7, s.num_q_heads, s.head_size, t.atol, t.rtol));

  // Eager launch with the bucket's max_seq_len and partition size: bitwise equal to the graph.
  DevBuf dt(w.tables.size() * 4), dl(w.lens.size() * 4), dout(qb), dq(qb);
  CK(cudaMemcpy(dt.p, w.tables.data(), w.tables.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dl.p, w.lens.data(), w.lens.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dq.p, q.data(), qb, cudaMemcpyHostToDevice));
  DecodeArgs a;
  a.spec = s;
  a.num_seqs = 7;
  a.max_seq_len = ex.plan_for(r).launch_len;  // what the graph's launches were sized for
  a.block_table_stride = w.stride;
  a.num_blocks = w.num_blocks;
  a.q = dq.p;
  a.out = dout.p;
  a.k_cache = dk.p;
  a.v_cache = dv.p;
  a.block_tables = static_cast<const int32_t*>(dt.p);
  a.seq_lens = static_cast<const int32_t*>(dl.p);
  if (r.kernel == KernelKind::kV1) {
    paged_attention_v1(a, nullptr);
  } else {
    const std::size_t ws = v2_workspace_size(s, 7, a.max_seq_len, r.partition_size);
    DevBuf work(ws);
    paged_attention_v2(a, r.partition_size, work.p, ws, nullptr);
    CK(cudaDeviceSynchronize());
  }
  CK(cudaDeviceSynchronize());
  EXPECT_TRUE(dgtest::bitwise_equal_on_device(g1.p, dout.p, qb)) << "graph output differs from eager output";
  EXPECT_GT(ex.memory().graphs, 0u);
#else
  (void)kind;
#endif
}

TEST(ExecutorGpu, V1GraphBitwiseEqualsEagerAndReplaysAreDeterministic) {
  DG_REQUIRE_GPU();
  run_gpu_case(KernelKind::kV1);
}

TEST(ExecutorGpu, V2GraphBitwiseEqualsEagerAndReplaysAreDeterministic) {
  DG_REQUIRE_GPU();
  run_gpu_case(KernelKind::kV2);
}

TEST(ExecutorGpu, MeasuredBucketTimesItsCandidatesThenMatchesEager) {
  DG_REQUIRE_GPU();
  run_gpu_case(KernelKind::kV1, /*measured=*/true);  // band (512, 1024]: V1 and V2 both candidates
}

#if DECODEGRAPH_HAS_CUDA
// A world whose caches live on the device; outputs are checked on the device.
struct GpuWorld {
  World w;
  std::vector<std::unique_ptr<DevBuf>> k, v;
  GpuWorld(AttentionSpec s, int layers, int max_seqs, int max_len, uint64_t seed)
      : w(s, layers, max_seqs, max_len, seed) {
    for (int l = 0; l < layers; ++l) {
      k.push_back(std::make_unique<DevBuf>(w.k[l].bytes));
      v.push_back(std::make_unique<DevBuf>(w.v[l].bytes));
      EXPECT_EQ(cudaMemcpy(k.back()->p, w.k[l].data(), w.k[l].bytes, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(v.back()->p, w.v[l].data(), w.v[l].bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ExecutorConfig config(int max_batch, int max_len) {
    ExecutorConfig c = w.config(max_batch, max_len);
    for (int l = 0; l < w.num_layers; ++l) {
      c.layers[l].k_cache = k[l]->p;
      c.layers[l].v_cache = v[l]->p;
    }
    c.backend = BackendKind::kCuda;
    c.append_kv = false;  // the device caches stay equal to the host copies the reference reads
    return c;
  }
  /// Random q for the live rows of every layer, copied into the executor's buffers (synchronously).
  /// Drawn on the host, not with Thrust: the float64 reference reads q there.
  std::vector<std::vector<char>> write_q(Executor& ex) {
    std::vector<std::vector<char>> qs;
    const std::size_t n = w.q_elems(static_cast<int>(w.lens.size()));
    for (int l = 0; l < w.num_layers; ++l) {
      qs.emplace_back(n * dtype_size(w.spec.dtype));
      dgtest::fill_uniform(w.spec.dtype, qs.back().data(), n, w.rng);
      EXPECT_EQ(cudaMemcpy(ex.query(l), qs.back().data(), qs.back().size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return qs;
  }
  /// Layer l's output (device) against the float64 reference of the current inputs.
  ::testing::AssertionResult check(Executor& ex, int l, const void* q_host) {
    const int n = static_cast<int>(w.lens.size());
    const std::vector<double> ref = w.reference(l, q_host);
    const dgtest::Tol t = dgtest::tol_for(w.spec.dtype);
    return dgtest::check_close_on_device(w.spec.dtype, ex.output(l), ref, n, w.spec.num_q_heads,
                                         w.spec.head_size, t.atol, t.rtol);
  }
};

AttentionSpec gpu_spec() {
  AttentionSpec s;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.head_size = 128;
  s.dtype = DType::kBFloat16;
  return s;
}
#endif

// Steps alternate between two caller streams and the legacy default stream without any host
// synchronisation: long (V2) and short steps in turn, so a step that started before the previous
// one finished would overwrite its staged inputs or let it overwrite the output. The final output
// must be the last step's.
TEST(ExecutorGpu, CallerStreamsInTurnAreOrderedByTheExecutor) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  GpuWorld g(gpu_spec(), 1, 8, 8192, 131);
  Executor ex(g.config(8, 8192));
  cudaStream_t a = nullptr, b = nullptr;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  g.w.set_lens({8000, 7000, 8192, 100});
  const auto qs = g.write_q(ex);  // q stays fixed: only lengths and tables change between steps
  std::vector<std::vector<int>> lens_of;
  for (int k = 0; k < 12; ++k) lens_of.push_back(k % 2 ? std::vector<int>{17, 3} : std::vector<int>{8000 - k, 7000, 8192, 100});
  std::vector<std::vector<int32_t>> lens(lens_of.size()), tables(lens_of.size());
  std::vector<std::vector<int64_t>> slots(lens_of.size());
  for (std::size_t k = 0; k < lens_of.size(); ++k) {
    g.w.set_lens(lens_of[k]);
    lens[k] = g.w.lens;
    tables[k] = g.w.tables;
    slots[k] = g.w.slots;
    StepInputs in = g.w.inputs();
    in.seq_lens = lens[k].data();  // kept alive: the staging copies read them asynchronously
    in.block_tables = tables[k].data();
    in.slot_mapping = slots[k].data();
    const Stream s = k % 3 == 0 ? a : (k % 3 == 1 ? b : nullptr);
    ex.step(in, s);
  }
  CK(cudaDeviceSynchronize());
  // The last step had two sequences; q rows 0 and 1 are the same as written.
  g.w.set_lens(lens_of.back());
  EXPECT_TRUE(g.check(ex, 0, qs[0].data()));
  EXPECT_NO_THROW(ex.check_errors());
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
#endif
}

// An fp32 spec over a bf16-sized cache: the driver's address range says it is too small.
TEST(ExecutorGpu, CacheTooSmallForTheSpecIsRejected) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  AttentionSpec s = gpu_spec();
  s.dtype = DType::kFloat32;
  const int num_blocks = 1024;  // 16 MiB of fp32: the halves stay whole 2 MiB pages
  const std::size_t need = static_cast<std::size_t>(num_blocks) * s.block_elems() * 4;
  DevBuf small(need / 2), k(need), v(need);
  ExecutorConfig c;
  c.spec = s;
  c.layers = {LayerBuffers{small.p, v.p}};
  c.max_batch = 4;
  c.max_seq_len = 1024;
  c.num_blocks = num_blocks;
  c.backend = BackendKind::kCuda;
  try {
    Executor ex(c);
    ADD_FAILURE() << "a cache half the size the spec needs was accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layers[0].k_cache"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(need / 2) + " bytes to the end of its allocation"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(need) + " bytes"), std::string::npos) << msg;
  }
  std::vector<char> host(need);
  c.layers = {LayerBuffers{k.p, host.data()}};
  try {
    Executor ex(c);
    ADD_FAILURE() << "a host pointer was accepted as a cache";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("layers[0].v_cache"), std::string::npos) << e.what();
  }
  c.layers = {LayerBuffers{k.p, v.p}};
  EXPECT_NO_THROW(Executor ex(c));
#endif
}

// kCheap: a block id past the cache is clamped on the device (no illegal address) and the next
// step reports it, naming the entry; then the executor carries on.
TEST(ExecutorGpu, BadBlockIdIsClampedAndReportedAtTheNextStep) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  GpuWorld g(gpu_spec(), 1, 4, 4096, 137);
  ExecutorConfig c = g.config(4, 4096);
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  g.w.set_lens({3000, 200, 4000});
  g.w.tables[2 * g.w.stride + 5] = g.w.num_blocks + 100;
  g.w.tables[2 * g.w.stride + 6] = -3;
  g.write_q(ex);
  ex.step(g.w.inputs());
  CK(cudaStreamSynchronize(ex.stream()));
  g.w.set_lens({10, 20});
  const auto qs = g.write_q(ex);
  try {
    ex.step(g.w.inputs());
    ADD_FAILURE() << "the bad block id was not reported";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    // Either bad entry may be the first one a block reported.
    EXPECT_TRUE(msg.find("inputs.block_tables[2][5]") != std::string::npos ||
                msg.find("inputs.block_tables[2][6]") != std::string::npos) << msg;
  }
  ex.step(g.w.inputs());
  CK(cudaStreamSynchronize(ex.stream()));
  EXPECT_TRUE(g.check(ex, 0, qs[0].data()));
  EXPECT_NO_THROW(ex.check_errors());
  EXPECT_EQ(ex.stats().bad_block_reports, 1);
#endif
}

// Device-resident inputs with a max_seq_len hint: no read-back, and the same result.
TEST(ExecutorGpu, DeviceInputsWithAHintAreNotReadBack) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  GpuWorld g(gpu_spec(), 1, 8, 4096, 139);
  ExecutorConfig c = g.config(8, 4096);
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  g.w.set_lens({4000, 1, 17, 2049, 700, 33, 4096});
  const auto qs = g.write_q(ex);
  DevBuf dl(g.w.lens.size() * 4), dt(g.w.tables.size() * 4);
  CK(cudaMemcpy(dl.p, g.w.lens.data(), g.w.lens.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt.p, g.w.tables.data(), g.w.tables.size() * 4, cudaMemcpyHostToDevice));
  StepInputs in = g.w.inputs();
  in.space = MemorySpace::kDevice;
  in.seq_lens = static_cast<const int32_t*>(dl.p);
  in.block_tables = static_cast<const int32_t*>(dt.p);
  in.slot_mapping = nullptr;
  in.max_seq_len = 4096;
  ex.step(in);
  CK(cudaStreamSynchronize(ex.stream()));
  EXPECT_EQ(ex.stats().input_downloads, 0);
  EXPECT_TRUE(g.check(ex, 0, qs[0].data()));
#endif
}

// rebind_layers on CUDA: cudaGraphExecUpdate in place (a pointer change keeps the topology), and
// the outputs come from the new caches.
TEST(ExecutorGpu, RebindUpdatesTheGraphsInPlace) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  GpuWorld g(gpu_spec(), 1, 4, 4096, 149);
  ExecutorConfig c = g.config(4, 4096);
  c.band_select = BandSelect::kHost;  // plain kernel nodes: cudaGraphExecUpdate must take them in place
  Executor ex(c);
  for (const std::vector<int>& lens : {std::vector<int>{100, 300}, std::vector<int>{3000, 4096, 7}}) {
    g.w.set_lens(lens);
    g.write_q(ex);
    ex.step(g.w.inputs());
  }
  CK(cudaStreamSynchronize(ex.stream()));
  GpuWorld other(gpu_spec(), 1, 4, 4096, 151);  // same shapes, other contents
  ex.rebind_layers({LayerBuffers{other.k[0]->p, other.v[0]->p}});
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.graph_updates, 2);
  EXPECT_EQ(st.graph_reinstantiations, 0);
  EXPECT_EQ(st.total_captures, 2);
  other.w.set_lens({3000, 4096, 7});
  const auto qs = other.write_q(ex);
  EXPECT_FALSE(ex.step(other.w.inputs()).captured);
  CK(cudaStreamSynchronize(ex.stream()));
  EXPECT_TRUE(other.check(ex, 0, qs[0].data()));
#endif
}

// ---------------------------------------------------------------- BandSelect::kDevice (issue 12)

#if DECODEGRAPH_HAS_CUDA
// Skips (with the reason) where the driver or runtime has no SWITCH nodes: the fallback is tested
// on the host backend.
#define DG_REQUIRE_SWITCH(ex)                                                                       \
  do {                                                                                              \
    if ((ex).band_select() != BandSelect::kDevice)                                                  \
      GTEST_SKIP() << "conditional SWITCH nodes unavailable: " << (ex).stats().band_select_note;   \
  } while (0)
#endif

// One SWITCH graph for the bucket replays V1 up to 8192 and V2 above as the lengths grow from 8000
// to 8400, without recapture, bitwise equal to the kHost executor's graphs on the same inputs.
TEST(ExecutorGpu, SwitchGraphMatchesKHostBitwiseAcrossThe8192Crossing) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  GpuWorld g(gpu_spec(), 1, 2, 8448, 163);
  ExecutorConfig c = g.config(2, 8448);
  c.policy = KernelPolicy::kThreshold;
  c.band_select = BandSelect::kDevice;
  Executor dev(c);
  DG_REQUIRE_SWITCH(dev);
  c.band_select = BandSelect::kHost;
  Executor host(c);
  const std::size_t qb = g.w.q_elems(2) * dtype_size(g.w.spec.dtype);
  long long v1 = 0, v2 = 0;
  for (int len = 8000; len <= 8400; len += 25) {
    g.w.set_lens({len, len - 37});
    const auto qs = g.write_q(dev);
    CK(cudaMemcpy(host.query(0), qs[0].data(), qb, cudaMemcpyHostToDevice));
    const StepResult rd = dev.step(g.w.inputs());
    host.step(g.w.inputs());
    ASSERT_EQ(rd.kernel, len <= 8192 ? KernelKind::kV1 : KernelKind::kV2) << len;
    (len <= 8192 ? v1 : v2) += 1;
    CK(cudaStreamSynchronize(dev.stream()));
    CK(cudaStreamSynchronize(host.stream()));
    EXPECT_TRUE(dgtest::bitwise_equal_on_device(dev.output(0), host.output(0), qb)) << "len " << len;
    if (len % 100 == 0) EXPECT_TRUE(g.check(dev, 0, qs[0].data())) << "len " << len;
  }
  const ExecutorStats st = dev.stats();
  EXPECT_EQ(st.total_captures, 1);
  EXPECT_EQ(st.replays(KernelKind::kV1), v1) << "branch counters read back from the device";
  EXPECT_EQ(st.replays(KernelKind::kV2), v2);
#endif
}

// Device-resident lengths with no hint: nothing is read back, the graph picks the band.
TEST(ExecutorGpu, SwitchGraphNeedsNoHintForDeviceInputs) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  GpuWorld g(gpu_spec(), 1, 8, 4096, 167);
  ExecutorConfig c = g.config(8, 4096);
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  DG_REQUIRE_SWITCH(ex);
  DevBuf dl(8 * 4), dt(g.w.tables.size() * 4 + 8 * 4 * g.w.stride);
  for (const std::vector<int>& lens : {std::vector<int>{4000, 1, 17, 2049, 700}, std::vector<int>{3, 600, 90, 513, 40}}) {
    g.w.set_lens(lens);
    const auto qs = g.write_q(ex);
    CK(cudaMemcpy(dl.p, g.w.lens.data(), g.w.lens.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dt.p, g.w.tables.data(), g.w.tables.size() * 4, cudaMemcpyHostToDevice));
    StepInputs in = g.w.inputs();
    in.space = MemorySpace::kDevice;
    in.seq_lens = static_cast<const int32_t*>(dl.p);
    in.block_tables = static_cast<const int32_t*>(dt.p);
    in.slot_mapping = nullptr;
    const StepResult r = ex.step(in);
    EXPECT_TRUE(r.band_on_device);
    CK(cudaStreamSynchronize(ex.stream()));
    EXPECT_TRUE(g.check(ex, 0, qs[0].data()));
  }
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.input_downloads, 0);
  EXPECT_EQ(st.total_captures, 1);
  ASSERT_EQ(st.graphs.size(), 1u);
  ASSERT_EQ(st.graphs[0].band_replays.size(), 4u);  // bands 512 1024 2048 4096
  EXPECT_EQ(st.graphs[0].band_replays[3], 1);
  EXPECT_EQ(st.graphs[0].band_replays[1], 1);
#endif
}

// rebind_layers under kDevice: the SWITCH graph is updated in place or re-instantiated (whichever
// the driver allows for conditional nodes), and reads the new caches.
TEST(ExecutorGpu, SwitchGraphRebindsToNewCaches) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  GpuWorld g(gpu_spec(), 1, 4, 4096, 173);
  Executor ex(g.config(4, 4096));
  DG_REQUIRE_SWITCH(ex);
  g.w.set_lens({3000, 20});
  g.write_q(ex);
  ex.step(g.w.inputs());
  CK(cudaStreamSynchronize(ex.stream()));
  GpuWorld other(gpu_spec(), 1, 4, 4096, 179);
  ex.rebind_layers({LayerBuffers{other.k[0]->p, other.v[0]->p}});
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.graph_updates + st.graph_reinstantiations, 1);
  other.w.set_lens({100, 4096});
  const auto qs = other.write_q(ex);
  EXPECT_FALSE(ex.step(other.w.inputs()).captured);
  CK(cudaStreamSynchronize(ex.stream()));
  EXPECT_TRUE(other.check(ex, 0, qs[0].data()));
#endif
}

}  // namespace
