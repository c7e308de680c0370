// GPU tests of the attention variants (sliding windows over freed blocks, sinks, soft-caps), the
// q_len query rows, and what a row reads but does not attend: non-finite K / V at positions a row
// masks (a window's edge block, the drafts after a row's query) never reach that row. Run on a GPU
// and under the CPU simulator (tests/sim); without a device every test reports itself skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "device_problem.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/probe.hpp"
#include "test_util.hpp"

namespace {

using namespace dggpu;

// ---------------------------------------------------------------- variants (issue 17)

// Sliding windows at the edges (W - 1, W, W + 1, 2W + 3, and far past: 8193, 40000): every
// block wholly before a window holds NaN and its table entry an invalid id, which must neither
// reach the output nor raise bad_block. Both maths (groups 1 and 4), both layouts, block sizes 8 /
// 16 / 32, V1 and V2 (partitions of 32 and 128 from the window's first block), and the naive kernel.
TEST(GpuKernels, SlidingWindowEdgesNeverReadFreedBlocks) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (int W : {1, 127, 128, 129}) {
    ProblemSpec ps;
    ps.spec = make_spec(kDTypes[i % 3], i % 2 ? 64 : 128, 8 << (i % 3), kLayouts[i % 2], 8, i % 2 ? 2 : 8);
    ps.spec.sliding_window = W;
    ps.lens = {std::max(1, W - 1), W, W + 1, 2 * W + 3, W == 128 ? 40000 : 8193};
    ps.distinct_blocks = true;
    ps.alibi = i == 2;
    ps.seed = 4100 + i++;
    auto p = dgtest::make_problem(ps);
    EXPECT_GT(dgtest::free_blocks_outside_window(*p), 0);
    p->run_reference();
    SCOPED_TRACE("W " + std::to_string(W) + ": " + describe(ps.spec));
    DeviceProblem dp(*p);
    DevBuf flag(sizeof(int));
    const int zero = 0;
    flag.upload(&zero, sizeof zero);
    dp.args.bad_block = static_cast<int*>(flag.ptr);
    const Tolerance t = tol_for(*p);
    dp.run_v1();
    EXPECT_TRUE(p->check(t)) << "V1";
    for (int P : {32, 128}) {
      dp.run_v2(P);
      EXPECT_TRUE(p->check(t)) << "V2 P=" << P;
    }
    int seen = -1;
    flag.download(&seen, sizeof seen);
    EXPECT_EQ(seen, 0) << "an entry before the window was read";
    dp.args.bad_block = nullptr;
    dp.run_naive();
    EXPECT_TRUE(p->check(t)) << "naive";
  }
}

// Sinks sigma in {-inf, 0, 5, 20} (per head sigma + h % 2), with and without gpt-oss's 128-token
// window, over 3001 tokens: 24 partitions of 128, where a sink counted per partition would show.
// Both maths (groups 1 and 8), V1, V2 and the naive kernel.
TEST(GpuKernels, SinksCountOnceAcrossPartitions) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (int W : {0, 128})
    for (float sigma : {-INFINITY, 0.0f, 5.0f, 20.0f}) {
      ProblemSpec ps;
      ps.spec = make_spec(i % 2 ? DType::kBFloat16 : DType::kFloat16, 64, 16, kLayouts[i % 2], 8, i % 4 < 2 ? 8 : 1);
      ps.spec.sliding_window = W;
      ps.lens = {3001, 129, 1};
      ps.distinct_blocks = true;
      ps.seed = 4200 + i++;
      auto p = dgtest::make_problem(ps);
      dgtest::free_blocks_outside_window(*p);
      std::vector<float> sinks(8);
      for (int h = 0; h < 8; ++h) sinks[h] = sigma + static_cast<float>(h % 2);
      p->set_sinks(sinks);
      p->run_reference();
      SCOPED_TRACE("W " + std::to_string(W) + " sigma " + std::to_string(sigma) + ": " + describe(ps.spec));
      DeviceProblem dp(*p);
      const Tolerance t = tol_for(*p);
      dp.run_v1();
      EXPECT_TRUE(p->check(t)) << "V1";
      dp.run_v2(128);
      EXPECT_TRUE(p->check(t)) << "V2";
      dp.run_naive();
      EXPECT_TRUE(p->check(t)) << "naive";
    }
}

// Soft-caps 1, 30 and 50 on large-norm q and k (logits in the hundreds: the cap bounds them), with
// ALiBi (added before the tanh) on one, with and without a window; both maths, V1 and V2.
TEST(GpuKernels, SoftcapOnLargeLogits) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (float cap : {1.0f, 30.0f, 50.0f})
    for (int W : {0, 129}) {
      ProblemSpec ps;
      ps.spec = make_spec(kDTypes[i % 3], 128, 16, kLayouts[i % 2], 8, i % 2 ? 2 : 8);
      ps.spec.sliding_window = W;
      ps.spec.logit_softcap = cap;
      ps.lens = {700, 17};
      ps.large_logits = true;
      ps.distinct_blocks = true;
      ps.alibi = cap == 30.0f;
      ps.seed = 4300 + i++;
      auto p = dgtest::make_problem(ps);
      dgtest::free_blocks_outside_window(*p);
      p->run_reference();
      SCOPED_TRACE("cap " + std::to_string(cap) + " W " + std::to_string(W) + ": " + describe(ps.spec));
      DeviceProblem dp(*p);
      dp.run_v1();
      EXPECT_TRUE(p->check(tol_for(*p))) << "V1";
      dp.run_v2(64);
      EXPECT_TRUE(p->check(tol_for(*p))) << "V2";
    }
}

// ---------------------------------------------------------------- q_len rows (issue 18)

// n query rows per sequence (speculative decoding's verify step): row j of a sequence of L tokens
// attends t <= L - n + j. n in {1, 2, 3, 4, 5, 8} at lengths n, n + 1, 127, 128 + n / 2 (from n 3
// the positions after row 0's query straddle a tile and a V2 partition boundary at 128, so the
// masked tail is two tiles) and past a partition (8192 + n), with a second sequence. The rows choose the math (n x next_pow2(group) rows: groups
// 1 and 2 reach the tensor cores from n = 4 and 2 on; fp32 stays on the CUDA cores), both layouts,
// V1 and V2 (P 32: many partitions, a last one that only some rows reach). Every third case adds a
// 64-token window (the rows' windows end at different positions), sinks, a soft-cap and ALiBi.
// The naive kernel takes one row and rejects the rest.
TEST(GpuKernels, QueryRowsMatchTheReference) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (int n : {1, 2, 3, 4, 5, 8})
    for (int L : {n, n + 1, 127, 128 + n / 2, 8192 + n}) {
      ProblemSpec ps;
      const int groups[] = {1, 2, 4, 8, 3};
      const int g = groups[i % 5];
      const int heads = g == 8 ? 16 : g == 3 ? 12 : 8;
      ps.spec = make_spec(kDTypes[i % 3], i % 2 ? 64 : 128, 16, kLayouts[(i / 3) % 2], heads, heads / g);
      if (i % 3 == 2) {
        ps.spec.sliding_window = 64;
        ps.spec.logit_softcap = 30.0f;
        ps.alibi = true;
      }
      ps.q_len = n;
      ps.lens = {L, std::max(n, L / 3 + 1)};
      ps.distinct_blocks = true;
      ps.seed = 5100 + i++;
      auto p = dgtest::make_problem(ps);
      dgtest::free_blocks_outside_window(*p);
      if (ps.spec.sliding_window > 0) {
        std::vector<float> sinks(ps.spec.num_q_heads);
        for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = h % 2 ? 2.0f : -INFINITY;
        p->set_sinks(sinks);
      }
      p->run_reference();
      SCOPED_TRACE("n " + std::to_string(n) + " L " + std::to_string(L) + ": " + describe(ps.spec));
      DeviceProblem dp(*p);
      const Tolerance t = tol_for(*p);
      dp.run_v1();
      EXPECT_TRUE(p->check(t)) << "V1";
      dp.run_v2(32);
      EXPECT_TRUE(p->check(t)) << "V2";
      if (n > 1) {
        EXPECT_THROW(dp.run_naive(), decodegraph::InvalidArgument) << "naive";
      }
    }
}

// A kernel that let every row see the whole sequence (a top-left or missing causal mask) fails:
// the device output against the reference of a step whose rows all sit at L - 1 differs.
TEST(GpuKernels, QueryRowsAreCausalNotAllAtTheLastPosition) {
  DG_REQUIRE_GPU();
  ProblemSpec ps;
  ps.spec = make_spec(DType::kBFloat16, 128, 16, KVLayout::kVLLM, 8, 2);
  ps.q_len = 4;
  ps.lens = {300};
  auto p = dgtest::make_problem(ps);
  p->run_reference();
  DeviceProblem dp(*p);
  dp.run_v1();
  ASSERT_TRUE(p->check(tol_for(*p)));
  // Rows 0..2 against the single-token answer at length 300 (what a missing mask would give).
  DecodeArgs last = p->args;
  last.q_len = 1;
  std::vector<double> ref(p->ref.size());
  const int len = 300;
  last.seq_lens = &len;
  for (int j = 0; j < 3; ++j) {
    last.q = static_cast<const char*>(p->q.data()) + static_cast<std::size_t>(j) * 8 * 128 * 2;
    decodegraph::reference::paged_attention(last, ref.data());
    const auto* row = static_cast<const char*>(p->out.data()) + static_cast<std::size_t>(j) * 8 * 128 * 2;
    EXPECT_FALSE(dgtest::check_close(DType::kBFloat16, row, ref.data(), 1, 8, 128, tol_for(*p).atol, tol_for(*p).rtol))
        << "row " << j << " attended past its query";
  }
}

// ---------------------------------------------------------------- reads a row does not attend (issue 39)

// +-inf and NaN in K and V at positions a row reads but masks (dgtest::masked_read_cases: the
// drafts after a row's query, a window's edge block, both at once), in every math, cache type and
// layout, V1 and V2 (P 64: the masked positions in the first and last partitions): a row that
// attends none of them is bitwise what it is with the cache's finite values there, a row that
// attends one is not finite. Before the edge tiles (kernels/paged_decode.cuh) the masked weight 0
// times an inf V made such rows NaN.
TEST(GpuKernels, MaskedNonFiniteValuesNeverReachARow) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (const dgtest::MaskedRead& c : dgtest::masked_read_cases())
    for (const dgtest::MaskedReadConfig& cf : dgtest::masked_read_configs())
      for (KVLayout layout : kLayouts) {
        auto p = dgtest::make_problem(dgtest::masked_read_problem(c, cf, layout, i));
        const float value = dgtest::masked_read_value(i++);
        p->run_reference();
        SCOPED_TRACE(std::string(c.name) + ", value " + std::to_string(value) + ": " + describe(p->args.spec) +
                     (cf.kv != KVCacheDType::kAuto ? " fp8" : ""));
        const std::vector<unsigned char> k0(static_cast<const unsigned char*>(p->k.data()),
                                            static_cast<const unsigned char*>(p->k.data()) + p->k.bytes);
        const std::vector<unsigned char> v0(static_cast<const unsigned char*>(p->v.data()),
                                            static_cast<const unsigned char*>(p->v.data()) + p->v.bytes);
        DeviceProblem dp(*p);
        for (int P : {0, 64}) {
          const auto run = [&] { P == 0 ? dp.run_v1() : dp.run_v2(P); };
          const char* form = P == 0 ? "V1" : "V2";
          std::memcpy(p->k.data(), k0.data(), k0.size());
          std::memcpy(p->v.data(), v0.data(), v0.size());
          dp.k->upload(p->k.data(), p->k.bytes);
          dp.v->upload(p->v.data(), p->v.bytes);
          run();
          ASSERT_TRUE(p->check(tol_for(*p))) << form << " with finite values";
          const std::vector<unsigned char> clean = dp.out_bytes();
          for (const auto& at : c.at) dgtest::set_cache_value(*p, 0, at.pos, at.key, value);
          dp.k->upload(p->k.data(), p->k.bytes);
          dp.v->upload(p->v.data(), p->v.bytes);
          run();
          EXPECT_TRUE(dgtest::check_masked_rows(*p, c, clean)) << form;
        }
      }
}

// A sink sigma far above every logit (dgtest::sink_above_cases), in every math, V1 and V2: the
// kernels shift by max(sigma, M), so e^(sigma - M) never overflows (before, the fp32 / bf16 paths
// returned 0 from sigma - M = 88.7 and the fp16 tensor-core path's 2^15-scaled weights from 78.3).
TEST(GpuKernels, SinkFarAboveEveryLogit) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (const dgtest::SinkAbove& c : dgtest::sink_above_cases())
    for (float sigma : c.sigmas) {
      auto p = dgtest::sink_above_problem(c, sigma, kLayouts[i % 2], i);
      ++i;
      p->run_reference();
      const Tolerance t = dgtest::sink_above_tolerance(p->args.spec.dtype, sigma, c.v_mag, 300);
      SCOPED_TRACE("sigma " + std::to_string(sigma) + ": " + describe(p->args.spec) + (p->args.spec.fp8_kv() ? " fp8" : ""));
      DeviceProblem dp(*p);
      dp.run_v1();
      EXPECT_TRUE(p->check(t)) << "V1";
      dp.run_v2(64);
      EXPECT_TRUE(p->check(t)) << "V2";
    }
}

// ---------------------------------------------------------------- the approximate instructions

// The instructions under the soft-cap (issue 39), against float64: ex2.approx within 2 ulp of the
// correctly rounded 2^x and rcp.approx within 1 ulp of 1 / x (PTX ISA 9.1, what docs/design.md's C
// term assumes), and the kernels' soft-cap (softcap2_dev) within 6.5 u c' of c' tanh(s' / c')
// (u = 2^-24, c' the base-2 cap: decode_math.hpp's bound) at the cap range's ends and Gemma 2's
// caps, over logits from -32 to 32 caps. Exact where PTX says so (2^0, 2^+-inf, 1 / +-0, 1 / +-inf,
// so the soft-cap's top, +c'). Prints what it measured ("[device math]" lines: bench/gpu_check.sh's
// summary); under the simulator it checks the bounds on its worst-case models (exactly 2 and 1 ulp).
namespace devmath {

std::vector<float> run(decodegraph::kernels::ProbeOp op, const std::vector<float>& in, float cap2 = 0.0f) {
  DevBuf din(in.size() * sizeof(float)), dout(in.size() * sizeof(float));
  din.upload(in.data(), in.size() * sizeof(float));
  decodegraph::kernels::probe_device_math(op, static_cast<const float*>(din.ptr), static_cast<float*>(dout.ptr),
                                          static_cast<int>(in.size()), cap2, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> out(in.size());
  dout.download(out.data(), out.size() * sizeof(float));
  return out;
}

// Distance in representable floats (0 for equal values, -0 == +0); huge for a NaN or a sign flip.
int64_t ulps(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return INT64_MAX;
  auto ordered = [](float x) {
    int32_t i;
    std::memcpy(&i, &x, sizeof i);
    return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : static_cast<int64_t>(i);
  };
  return std::llabs(ordered(a) - ordered(b));
}

}  // namespace devmath

TEST(GpuKernels, SoftcapDeviceMathAgainstTanh) {
  DG_REQUIRE_GPU();
  using decodegraph::kernels::ProbeOp;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr int kGrid = 1 << 18;
  // ex2: results from 2^-126 to 2^127 (normal: .ftz flushes the rest), and the exact points.
  {
    std::vector<float> x;
    for (int i = 0; i < kGrid; ++i) x.push_back(-126.0f + 253.99f * static_cast<float>(i) / kGrid);
    const std::vector<float> special = {0.0f, -0.0f, kInf, -kInf};
    x.insert(x.end(), special.begin(), special.end());
    const std::vector<float> y = devmath::run(ProbeOp::kEx2, x);
    int64_t worst = 0;
    float at = 0;
    for (int i = 0; i < kGrid; ++i) {
      const int64_t e = devmath::ulps(y[i], static_cast<float>(std::exp2(static_cast<double>(x[i]))));
      if (e > worst) worst = e, at = x[i];
    }
    std::printf("[device math] ex2.approx: max %lld ulp from the correctly rounded 2^x (at x = %.9g) over %d inputs "
                "in [-126, 128); PTX: at most 2\n", static_cast<long long>(worst), at, kGrid);
    EXPECT_LE(worst, 2) << "at x = " << at;
#ifndef DECODEGRAPH_SIM  // the simulator moves 2^0 too, on purpose (tests/sim/README.md, "ex2.approx")
    EXPECT_EQ(y[kGrid + 0], 1.0f);
    EXPECT_EQ(y[kGrid + 1], 1.0f);
#endif
    EXPECT_EQ(y[kGrid + 2], kInf);
    EXPECT_EQ(y[kGrid + 3], 0.0f);
  }
  // rcp: every 8th mantissa of [1, 2) at three binades (small, 1, large) and both signs.
  {
    std::vector<float> x;
    for (float scale : {0x1p-100f, 1.0f, -0x1p+60f})
      for (int m = 0; m < (1 << 23); m += 8) x.push_back(scale * (1.0f + static_cast<float>(m) * 0x1p-23f));
    const std::size_t n = x.size();
    const std::vector<float> special = {0.0f, -0.0f, kInf, -kInf};
    x.insert(x.end(), special.begin(), special.end());
    const std::vector<float> y = devmath::run(ProbeOp::kRcp, x);
    int64_t worst = 0;
    float at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const int64_t e = devmath::ulps(y[i], static_cast<float>(1.0 / static_cast<double>(x[i])));
      if (e > worst) worst = e, at = x[i];
    }
    std::printf("[device math] rcp.approx: max %lld ulp from the correctly rounded 1 / x (at x = %.9g) over %zu inputs; "
                "PTX: at most 1\n", static_cast<long long>(worst), at, n);
    EXPECT_LE(worst, 1) << "at x = " << at;
    EXPECT_EQ(y[n + 0], kInf);
    EXPECT_EQ(y[n + 1], -kInf);
    EXPECT_EQ(y[n + 2], 0.0f);
    EXPECT_EQ(y[n + 3], 0.0f);
    EXPECT_TRUE(std::signbit(y[n + 3]));
  }
  // The soft-cap, per cap, as the launch forms it (launch.cu: c' = c log2(e) in float).
  constexpr double kU = 0x1p-24;
  constexpr double kBound = 6.5;  // units of u c' (decode_math.hpp, softcap2; docs/design.md, C)
  for (float cap : {decodegraph::kMinLogitSoftcap, 1.0f, 30.0f, 50.0f, decodegraph::kMaxLogitSoftcap}) {
    const float cap2 = cap * decodegraph::math::kLog2e;
    std::vector<float> s2;
    for (int i = 0; i <= kGrid; ++i) s2.push_back(cap2 * (-32.0f + 64.0f * static_cast<float>(i) / kGrid));
    const std::size_t n = s2.size();
    const std::vector<float> special = {kInf, -kInf, 1e30f * cap2, -1e30f * cap2};
    s2.insert(s2.end(), special.begin(), special.end());
    const std::vector<float> y = devmath::run(ProbeOp::kSoftcap2, s2, cap2);
    double worst = 0, sum2 = 0;
    float at = 0;
    std::size_t non_finite = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!std::isfinite(y[i])) {
        ++non_finite;
        continue;
      }
      const double ref = static_cast<double>(cap2) * std::tanh(static_cast<double>(s2[i]) / cap2);
      const double e = std::fabs(y[i] - ref) / (kU * cap2);
      sum2 += e * e;
      if (e > worst) worst = e, at = s2[i] / cap2;
    }
    std::printf("[device math] soft-cap c = %g: max %.2f u c' (at s / c = %.4g), rms %.2f, over %zu logits in "
                "[-32 c, 32 c]; bound %.1f\n", cap, worst, at, std::sqrt(sum2 / n), n, kBound);
    EXPECT_EQ(non_finite, 0u) << "cap " << cap;
    EXPECT_LE(worst, kBound) << "cap " << cap << " at s / c = " << at;
    // The top saturates exactly (2^huge = inf, 1 / inf = 0); the bottom is c' - 2 c' rcp(1).
    EXPECT_EQ(y[n + 0], cap2) << "cap " << cap;
    EXPECT_EQ(y[n + 2], cap2) << "cap " << cap;
    EXPECT_LE(std::fabs(y[n + 1] + cap2), kBound * kU * cap2) << "cap " << cap;
    EXPECT_LE(std::fabs(y[n + 3] + cap2), kBound * kU * cap2) << "cap " << cap;
  }
}

}  // namespace
