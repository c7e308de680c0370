// GPU executor tests (skip without a device): graph replay against the float64 reference, graph
// output bitwise equal to the eager launchers' output, and two replays of the same inputs bitwise
// equal, for a V1 and a V2 bucket and for a bucket kMeasured chose by timing candidates with events.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "exec_world.hpp"

#if DECODEGRAPH_HAS_CUDA
#include <cuda_runtime.h>
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
  std::vector<char> q(qb), g1(qb), g2(qb), eager(qb);
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
  CK(cudaMemcpy(g1.data(), ex.output(0), qb, cudaMemcpyDeviceToHost));
  ex.step(w.inputs());
  CK(cudaStreamSynchronize(ex.stream()));
  CK(cudaMemcpy(g2.data(), ex.output(0), qb, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(g1.data(), g2.data(), qb), 0) << "two replays differ";

  std::vector<double> ref = w.reference(0, q.data());
  const dgtest::Tol t = dgtest::tol_for(s.dtype);
  EXPECT_TRUE(dgtest::check_close(s.dtype, g1.data(), ref.data(), 7, s.num_q_heads, s.head_size, t.atol, t.rtol));

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
  CK(cudaMemcpy(eager.data(), dout.p, qb, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(g1.data(), eager.data(), qb), 0) << "graph output differs from eager output";
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

}  // namespace
