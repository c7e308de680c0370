// Policy sweep on the CUDA simulator: for every dtype x head_size (one test each, so ctest runs
// them in parallel) and every block_size x layout, V1, V2 at two partition sizes and the naive
// kernel against the float64 reference, with padded rows left untouched. Lengths cover 1, 0
// (padded row), bs-1, a partition size +-1 and a multi-partition length.
// CI: one group shape per (block_size, layout), rotating through the list, and one thread order
// per case (alternating). DECODEGRAPH_SIM_FULL=1: every group shape, both thread orders. Each
// launch also checks which pass-1 math ran (tensor cores for fp16 / bf16 with groups >= 4, and
// for fp8 caches at every group).
// Fp8Sweep: the same for fp8 caches (E4M3, E5M2) x head size, the model dtype fp16 or bf16 (CI:
// alternating by head size; full: both) and the scale rule (k 0.5 / v 0.25, amax / 256 per layer,
// amax / 256 per KV head) rotating with the (block size, layout) combination.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/numerics.hpp"
#include "../kernels/problem.hpp"
#include "sim_problem.hpp"
#include "cuda_runtime.h"
#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "kernels/legacy/legacy.hpp"
#include "kernels/naive.hpp"
#include "test_util.hpp"

#ifndef DECODEGRAPH_SIM
#error "tests/sim must compile against tests/sim/shim, not the CUDA toolkit headers"
#endif

namespace {

using namespace decodegraph;

// Same bounds as the GPU kernel tests (tests/kernels/problem.hpp: the output's own rounding plus
// the kernels' error).
dgtest::Tolerance tol(DType d) { return dgtest::kernel_tolerance(d); }

bool full_sweep() {
  const char* f = std::getenv("DECODEGRAPH_SIM_FULL");
  return f != nullptr && std::strcmp(f, "") != 0 && std::strcmp(f, "0") != 0;
}

using dgsim::Dev;
using dgsim::sim_ok;

struct Case {
  DType dtype;
  int head_size, block_size;
  KVLayout layout;
  int q_heads, kv_heads;
  bool alibi;
  uint64_t seed;
  KVCacheDType kv = KVCacheDType::kAuto;
  int scale_rule = 0;  // fp8: 0 k 0.5 / v 0.25, 1 amax / 256, 2 amax / 256 per KV head
};

std::string describe(const Case& c, int P = 0) {
  std::string s = std::string(to_string(c.dtype)) + " D=" + std::to_string(c.head_size) +
                  " bs=" + std::to_string(c.block_size) + " " + to_string(c.layout) + " heads " +
                  std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) +
                  (c.alibi ? " alibi" : "") + " order " + sim::order_name();
  if (c.kv != KVCacheDType::kAuto) s += std::string(" kv ") + to_string(c.kv) + " scales rule " + std::to_string(c.scale_rule);
  if (P > 0) s += " P=" + std::to_string(P);
  return s;
}

void run_case(const Case& c) {
  const int bs = c.block_size;
  // Two partition sizes (multiples of the block size): one larger than a kernel tile, one small.
  const int p_large = 64, p_small = 2 * bs;
  dgtest::ProblemSpec ps;
  ps.spec.dtype = c.dtype;
  ps.spec.head_size = c.head_size;
  ps.spec.block_size = bs;
  ps.spec.layout = c.layout;
  ps.spec.num_q_heads = c.q_heads;
  ps.spec.num_kv_heads = c.kv_heads;
  ps.spec.kv_dtype = c.kv;
  ps.spec.kv_scale_per_head = c.scale_rule == 2;
  if (c.scale_rule > 0) ps.k_scale = ps.v_scale = 0.0f;  // amax / 256
  ps.lens = {1, 0, bs - 1, p_large - 1, p_large + 1, 2 * p_large + bs + 3};
  ps.max_seq_len = *std::max_element(ps.lens.begin(), ps.lens.end()) + 40;  // band edge above
  ps.alibi = c.alibi;
  ps.seed = c.seed;
  auto p = dgtest::make_problem(ps);
  p->run_reference();

  dgsim::DeviceProblem dp(*p);
  const DecodeArgs& a = dp.args;
  Dev& out = dp.out;
  const dgtest::Tolerance t = tol(c.dtype);
  // Pass 1 runs on tensor cores exactly for fp16 / bf16 with groups of 4 or more, and for fp8
  // caches always (the launcher's rule, restated here so that a dispatch change cannot pass
  // unnoticed); the naive kernel never.
  const bool tensor_cores = c.kv != KVCacheDType::kAuto || (c.dtype != DType::kFloat32 && c.q_heads / c.kv_heads >= 4);
  auto run = [&](auto&& launch, const std::string& what, bool expect_mma) {
    sim_ok(cudaMemcpy(out.p, p->poisoned.data(), p->poisoned.bytes, cudaMemcpyHostToDevice), "poison");
    const long mma_before = sim::mma_count();
    launch();
    EXPECT_EQ(sim::mma_count() > mma_before, expect_mma) << what << ": tensor-core path "
                                                         << (expect_mma ? "not taken" : "taken");
    sim_ok(cudaMemcpy(p->out.data(), out.p, p->poisoned.bytes, cudaMemcpyDeviceToHost), "fetch");
    EXPECT_TRUE(p->check(t)) << what;
    EXPECT_TRUE(p->padded_rows_untouched()) << what;
  };
  // The host implementation models the device math per path: same outputs and partials to fp32
  // noise (numerics.hpp, ModelCheck).
  namespace nm = dgtest::numerics;
  const nm::Reference whole = nm::reference_partitions(p->args, p->args.max_seq_len);
  auto host_out = dgtest::make_buffer(c.dtype, p->out_elems);
  DecodeArgs h = p->args;
  h.out = host_out.data();
  run([&] { paged_attention_v1(a, nullptr); }, "V1 " + describe(c), tensor_cores);
  host::paged_attention_v1(h);
  EXPECT_TRUE(nm::outputs_match(p->args, whole, host_out.data(), p->out.data(), nm::model_check(a.spec))) << "host V1 vs device V1 " << describe(c);
  for (int P : {p_large, p_small}) {
    const std::size_t wb = v2_workspace_size(a.spec, a.num_seqs, a.max_seq_len, P);
    Dev ws(wb);
    sim_ok(cudaMemset(ws.p, 0xff, wb), "cudaMemset");  // NaN: the merge reads only fresh partials
    run([&] { paged_attention_v2(a, P, ws.p, wb, nullptr); }, "V2 " + describe(c, P), tensor_cores);
    std::vector<unsigned char> dev_ws(wb);
    sim_ok(cudaMemcpy(dev_ws.data(), ws.p, wb, cudaMemcpyDeviceToHost), "fetch workspace");
    const auto host_ws = dgtest::run_host_v2(h, P);
    EXPECT_TRUE(nm::partials_match(p->args, nm::reference_partitions(p->args, P), P, host_ws.data(), dev_ws.data(),
                                   nm::model_check(a.spec)))
        << "host V2 partials vs device " << describe(c, P);
    EXPECT_TRUE(nm::outputs_match(p->args, whole, host_out.data(), p->out.data(), nm::model_check(a.spec))) << "host V2 vs device V2 " << describe(c, P);
  }
  if (c.kv == KVCacheDType::kAuto) run([&] { naive::paged_attention_v1(a, nullptr); }, "naive " + describe(c), false);
}

// Group shapes: GQA groups 1..32 (above 16 splits into head chunks), MHA 40/40, 64/8.
constexpr std::pair<int, int> kGroups[] = {{4, 2}, {40, 40}, {5, 1}, {24, 1}, {8, 2}, {64, 8},
                                           {2, 2}, {16, 1}, {10, 2}, {32, 1}, {8, 1}};
constexpr int kNumGroups = static_cast<int>(sizeof(kGroups) / sizeof(kGroups[0]));

class Sweep : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(Sweep, AllBlockSizesLayoutsGroups) {
  const auto [dtype, head_size] = GetParam();
  const bool full = full_sweep();
  const int dt = static_cast<int>(dtype);
  int combo = 0;
  for (int bs : {8, 16, 32}) {
    for (KVLayout layout : {KVLayout::kVLLM, KVLayout::kNHD}) {
      ++combo;
      // CI: one group shape per combo, rotated by dtype, head size and combo so every shape
      // meets every dtype and several head sizes.
      const int first = (dt * 5 + head_size / 16 + combo) % kNumGroups;
      for (int gi = 0; gi < (full ? kNumGroups : 1); ++gi) {
        const auto [qh, kvh] = kGroups[(first + gi) % kNumGroups];
        const uint64_t seed = 1000 * static_cast<uint64_t>(head_size) + 100 * dt + 10 * combo + gi;
        const Case c{dtype, head_size, bs, layout, qh, kvh, seed % 3 == 0, seed};
        const std::vector<sim::Order> orders =
            full ? std::vector<sim::Order>{sim::Order::kForward, sim::Order::kReverse}
                 : std::vector<sim::Order>{(combo % 2) ? sim::Order::kForward : sim::Order::kReverse};
        for (sim::Order o : orders) {
          sim::set_order(o);
          SCOPED_TRACE(describe(c));
          run_case(c);
        }
      }
    }
  }
  sim::set_order(sim::Order::kFromEnv);
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, int>>& info) {
  return std::string(to_string(std::get<0>(info.param))) + "_D" + std::to_string(std::get<1>(info.param));
}

class Fp8Sweep : public ::testing::TestWithParam<std::tuple<KVCacheDType, int>> {};

TEST_P(Fp8Sweep, AllBlockSizesLayoutsGroupsScales) {
  const auto [kv, head_size] = GetParam();
  const bool full = full_sweep();
  const int kd = static_cast<int>(kv);
  int combo = 0;
  for (int bs : {8, 16, 32}) {
    for (KVLayout layout : {KVLayout::kVLLM, KVLayout::kNHD}) {
      ++combo;
      const int first = (kd * 3 + head_size / 16 + combo) % kNumGroups;
      for (int gi = 0; gi < (full ? kNumGroups : 1); ++gi) {
        const auto [qh, kvh] = kGroups[(first + gi) % kNumGroups];
        const std::vector<DType> models = full ? std::vector<DType>{DType::kBFloat16, DType::kFloat16}
                                               : std::vector<DType>{((head_size / 16 + kd + combo) % 2) ? DType::kFloat16
                                                                                                         : DType::kBFloat16};
        for (DType model : models) {
          const uint64_t seed = 1000 * static_cast<uint64_t>(head_size) + 100 * (kd + 4) + 10 * combo + gi;
          Case c{model, head_size, bs, layout, qh, kvh, seed % 3 == 0, seed, kv, (combo + gi) % 3};
          const std::vector<sim::Order> orders =
              full ? std::vector<sim::Order>{sim::Order::kForward, sim::Order::kReverse}
                   : std::vector<sim::Order>{(combo % 2) ? sim::Order::kReverse : sim::Order::kForward};
          for (sim::Order o : orders) {
            sim::set_order(o);
            SCOPED_TRACE(describe(c));
            run_case(c);
          }
        }
      }
    }
  }
  sim::set_order(sim::Order::kFromEnv);
}

std::string fp8_param_name(const ::testing::TestParamInfo<std::tuple<KVCacheDType, int>>& info) {
  return std::string(to_string(std::get<0>(info.param))) + "_D" + std::to_string(std::get<1>(info.param));
}

// The legacy pass 1 (bench_attention's kernel:legacy) is only a benchmark comparison, but its
// numbers must still be right for that comparison to mean anything.
TEST(Legacy, MatchesReference) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (KVLayout layout : {KVLayout::kVLLM, KVLayout::kNHD}) {
      dgtest::ProblemSpec ps;
      ps.spec.dtype = dt;
      ps.spec.layout = layout;
      ps.spec.head_size = 128;
      ps.spec.num_q_heads = 8;
      ps.spec.num_kv_heads = 2;
      ps.lens = {1, 0, 200, 77};
      ps.max_seq_len = 256;
      ps.seed = 70 + static_cast<int>(dt) * 2 + static_cast<int>(layout);
      auto p = dgtest::make_problem(ps);
      p->run_reference();
      dgsim::DeviceProblem dp(*p);
      DecodeArgs a = dp.args;
      Dev& out = dp.out;
      ASSERT_TRUE(legacy::supports(a.spec));
      const std::size_t wb = v2_workspace_size(a.spec, a.num_seqs, a.max_seq_len, 64);
      Dev ws(wb);
      for (int version = 1; version <= 2; ++version) {
        sim_ok(cudaMemcpy(out.p, p->poisoned.data(), p->poisoned.bytes, cudaMemcpyHostToDevice), "poison");
        if (version == 1)
          legacy::paged_attention_v1(a, nullptr);
        else
          legacy::paged_attention_v2(a, 64, ws.p, wb, nullptr);
        sim_ok(cudaMemcpy(p->out.data(), out.p, p->poisoned.bytes, cudaMemcpyDeviceToHost), "fetch");
        EXPECT_TRUE(p->check(tol(dt))) << "legacy V" << version << " " << to_string(dt) << " " << to_string(layout);
        EXPECT_TRUE(p->padded_rows_untouched());
      }
      a.q_stride = 8 * 128 + 8;  // what the legacy kernel cannot do is rejected, not ignored
      EXPECT_THROW(legacy::paged_attention_v1(a, nullptr), Error);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sim, Sweep,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16,
                                                              DType::kFloat32),
                                            ::testing::Values(64, 80, 96, 112, 128, 192, 256)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Sim, Fp8Sweep,
                         ::testing::Combine(::testing::Values(KVCacheDType::kFp8E4M3, KVCacheDType::kFp8E5M2),
                                            ::testing::Values(64, 80, 96, 112, 128, 192, 256)),
                         fp8_param_name);

}  // namespace
