// GPU executor test (skips without a device): under kCheap on the CUDA backend, a slot of position
// seq_len instead of seq_len - 1, and seq_lens that do not count the new token, are skipped by the
// append kernel (the cache is unchanged at both slots) and reported at the next step() as a
// CorruptedStepReport naming the sequence, for BandSelect kHost and kDevice (where supported);
// the resubmitted step then runs and every row is right against the float64 reference.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"

#if DECODEGRAPH_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace {
using namespace decodegraph;
using dgtest::World;

#if DECODEGRAPH_HAS_CUDA
#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Random q and new K/V for the live rows, uploaded into the executor's (device) buffers.
void fill_device(World& w, Executor& ex) {
  const int n = static_cast<int>(w.lens.size());
  const DType dt = w.spec.dtype;
  dgtest::Buffer q = dgtest::make_buffer(dt, w.q_elems(n)), k = dgtest::make_buffer(dt, w.kv_elems(n)),
                 v = dgtest::make_buffer(dt, w.kv_elems(n));
  dgtest::fill_uniform(dt, q.data(), w.q_elems(n), w.rng);
  dgtest::fill_uniform(dt, k.data(), w.kv_elems(n), w.rng);
  dgtest::fill_uniform(dt, v.data(), w.kv_elems(n), w.rng);
  ASSERT_EQ(cudaMemcpy(ex.query(0), q.data(), q.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ex.new_key(0), k.data(), k.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ex.new_value(0), v.data(), v.bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

void run_slot_report(BandSelect mode, bool lens_short) {
  AttentionSpec s;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.head_size = 128;
  s.dtype = DType::kBFloat16;
  World w(s, 1, 4, 1024, 301);
  const std::size_t bytes = w.k[0].bytes;
  void* dk = nullptr;
  void* dv = nullptr;
  CK(cudaMalloc(&dk, bytes));
  CK(cudaMalloc(&dv, bytes));
  CK(cudaMemcpy(dk, w.k[0].data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, w.v[0].data(), bytes, cudaMemcpyHostToDevice));
  ExecutorConfig c = w.config(4, 1024);
  c.layers[0].k_cache = dk;
  c.layers[0].v_cache = dv;
  c.backend = BackendKind::kCuda;
  c.validation = ValidationLevel::kCheap;
  c.band_select = mode;
  {
    Executor ex(c);
    w.set_lens({300, 41, 7});
    const int64_t right = w.slots[1];
    if (lens_short)
      w.lens[1] = 40;  // the new token not counted; the slot is that of position 40
    else
      w.slots[1] = static_cast<int64_t>(w.seq_blocks[1][41 / 16]) * 16 + 41 % 16;  // position 41 = seq_len
    std::vector<unsigned char> before(bytes), after(bytes);
    CK(cudaMemcpy(before.data(), dk, bytes, cudaMemcpyDeviceToHost));
    fill_device(w, ex);
    ex.step(w.inputs());
    CK(cudaStreamSynchronize(ex.stream()));
    CK(cudaMemcpy(after.data(), dk, bytes, cudaMemcpyDeviceToHost));
    // The K cache bytes of slot `slot` for every head (vLLM layout, bf16: x = 8).
    auto same_slot = [&](int64_t slot) {
      const int x = 8;
      for (int h = 0; h < s.num_kv_heads; ++h)
        for (int d = 0; d < s.head_size; ++d) {
          const int64_t o = math::k_offset(s.layout, slot / 16, h, static_cast<int>(slot % 16), d, s.num_kv_heads,
                                           s.head_size, 16, x);
          if (std::memcmp(before.data() + o * 2, after.data() + o * 2, 2) != 0) return false;
        }
      return true;
    };
    EXPECT_TRUE(same_slot(right)) << "the skipped token was written";
    EXPECT_TRUE(same_slot(w.slots[1])) << "the wrong slot was written";
    EXPECT_FALSE(same_slot(w.slots[0])) << "sequence 0's token was not appended";

    w.set_lens({301, 42, 8});
    fill_device(w, ex);
    try {
      ex.step(w.inputs());
      ADD_FAILURE() << "the wrong slot was not reported";
    } catch (const CorruptedStepReport& e) {
      EXPECT_EQ(e.kind(), CorruptedStepReport::Kind::kSlotMismatch) << e.what();
      EXPECT_EQ(e.sequence(), 1) << e.what();
      EXPECT_TRUE(e.step_refused());
      EXPECT_NE(std::string(e.what()).find("Re-prefill sequence 1"), std::string::npos) << e.what();
    }
    ex.step(w.inputs());  // resubmitted: runs
    CK(cudaStreamSynchronize(ex.stream()));
    EXPECT_NO_THROW(ex.check_errors());
    // Rows 0 and 2 are right; row 1 read a stale slot in step 1 and is not checked.
    CK(cudaMemcpy(w.k[0].data(), dk, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(w.v[0].data(), dv, bytes, cudaMemcpyDeviceToHost));
    std::vector<unsigned char> q(w.q_elems(3) * 2), out(w.q_elems(3) * 2);
    CK(cudaMemcpy(q.data(), ex.query(0), q.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(out.data(), ex.output(0), out.size(), cudaMemcpyDeviceToHost));
    const std::vector<double> ref = w.reference(0, q.data());
    const dgtest::Tol t = dgtest::tol_for(s.dtype);
    EXPECT_TRUE(dgtest::check_close(s.dtype, out.data(), ref.data(), 3, s.num_q_heads, s.head_size, t.atol, t.rtol,
                                    {true, false, true}));
  }
  cudaFree(dk);
  cudaFree(dv);
}
#endif

TEST(ExecutorGpuReport, WrongSlotIsSkippedAndReportedKHost) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  run_slot_report(BandSelect::kHost, false);
  run_slot_report(BandSelect::kHost, true);
#endif
}

TEST(ExecutorGpuReport, WrongSlotIsSkippedAndReportedKDevice) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  run_slot_report(BandSelect::kDevice, false);  // falls back to kHost where SWITCH nodes are missing
  run_slot_report(BandSelect::kDevice, true);
#endif
}

}  // namespace
