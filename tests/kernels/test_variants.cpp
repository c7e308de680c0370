// Sliding windows, attention sinks and logit soft-capping (issue 17) on the host implementation
// against the float64 reference, and the reference itself against closed forms that share nothing
// with it. Every window case frees the blocks wholly before the window as vLLM's hybrid allocator
// does (NaN data, invalid table entries): reading one gives NaN or an error, never a pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "problem.hpp"

namespace {

using namespace dgtest;
using decodegraph::DType;

// ---------------------------------------------------------------- window x length grid

struct WindowCase {
  int window, len;
  int index;
  friend void PrintTo(const WindowCase& c, std::ostream* os) { *os << "W " << c.window << " L " << c.len; }
};

std::vector<WindowCase> window_cases() {
  std::vector<WindowCase> out;
  int i = 0;
  for (int W : {1, 2, 127, 128, 129, 512, 1024, 4096}) {
    std::vector<int> seen;
    for (int L : {1, W - 1, W, W + 1, 2 * W + 3, 8191, 8193, 40000})
      if (L >= 1 && std::find(seen.begin(), seen.end(), L) == seen.end()) {
        seen.push_back(L);
        out.push_back({W, L, i++});
      }
  }
  return out;
}

class HostWindow : public ::testing::TestWithParam<WindowCase> {};

// Every (W, L) of the issue, each with a second, shorter sequence; dtype, block size, layout and
// the GQA group (1: CUDA-core math, 4: tensor-core math) rotate over the cases; V2 at two partition
// sizes (the window spans up to 33 partitions of 128).
TEST_P(HostWindow, V1AndV2MatchReferenceWithFreedBlocksPoisoned) {
  const WindowCase c = GetParam();
  const DType dtypes[] = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
  ProblemSpec ps;
  ps.spec.num_q_heads = 8;
  ps.spec.num_kv_heads = c.index % 2 ? 2 : 8;
  ps.spec.head_size = 64;
  ps.spec.block_size = 8 << (c.index % 3);
  ps.spec.dtype = dtypes[c.index % 3];
  ps.spec.layout = c.index % 4 < 2 ? KVLayout::kVLLM : KVLayout::kNHD;
  ps.spec.sliding_window = c.window;
  ps.lens = {c.len, c.len / 2 + 1};
  ps.distinct_blocks = true;
  ps.seed = 1700 + c.index;
  auto p = make_problem(ps);
  const int freed = free_blocks_outside_window(*p);
  if (c.len > c.window + 2 * ps.spec.block_size) EXPECT_GT(freed, 0);
  p->run_reference();

  // kFull-style validation with host copies reads only the window's entries.
  DecodeArgs checked = p->args;
  checked.host_seq_lens = p->lens.data();
  checked.host_block_tables = p->tables.data();
  EXPECT_NO_THROW(decodegraph::validate_decode_args(checked));

  decodegraph::host::paged_attention_v1(p->args);
  EXPECT_TRUE(p->check(p->tol())) << "V1";
  for (int P : {128, 512}) {
    p->poison_out();
    run_host_v2(p->args, P);
    EXPECT_TRUE(p->check(p->tol())) << "V2, P = " << P;
  }
}

INSTANTIATE_TEST_SUITE_P(Issue17, HostWindow, ::testing::ValuesIn(window_cases()),
                         [](const ::testing::TestParamInfo<WindowCase>& i) {
                           return "W" + std::to_string(i.param.window) + "_L" + std::to_string(i.param.len);
                         });

// ---------------------------------------------------------------- closed forms

// Zero keys make every logit 0, so the output is the sum of the attended V rows over
// (n + e^sink), n the attended count: W - 1, W and W + 1 give different sums (V is random), so this
// pins the convention (t in (p - W, p], p = L - 1) on the reference and the host alike. NHD fp32,
// so the test reads V with its own index arithmetic.
TEST(HostWindow, ZeroKeysAverageExactlyTheLastWTokens) {
  for (int W : {1, 2, 127, 128, 129})
    for (int L : {W - 1, W, W + 1, 2 * W + 3})
      for (float sink : {-INFINITY, 0.0f, 5.0f}) {
        if (L < 1) continue;
        ProblemSpec ps;
        ps.spec.num_q_heads = 4;
        ps.spec.num_kv_heads = 2;
        ps.spec.head_size = 64;
        ps.spec.block_size = 16;
        ps.spec.dtype = DType::kFloat32;
        ps.spec.layout = KVLayout::kNHD;
        ps.spec.sliding_window = W;
        ps.lens = {L};
        ps.distinct_blocks = true;
        ps.seed = 99 + W + L;
        auto p = make_problem(ps);
        std::memset(p->k.data(), 0, p->k.bytes);
        std::vector<float> sinks(4, sink);
        p->args.sinks = sinks.data();
        // Expected before the freed blocks are poisoned.
        const AttentionSpec& s = p->args.spec;
        const int first = L > W ? L - W : 0, n = L - first;
        const double denom = n + (sink == -INFINITY ? 0.0 : std::exp(double(sink)));
        std::vector<double> want(static_cast<std::size_t>(4) * 64, 0.0);
        const auto* v = static_cast<const float*>(p->v.data());
        for (int h = 0; h < 4; ++h)
          for (int t = first; t < L; ++t) {
            const int64_t block = p->tables[t / 16];
            for (int d = 0; d < 64; ++d)
              want[h * 64 + d] += v[((block * 16 + t % 16) * s.num_kv_heads + h / 2) * 64 + d] / denom;
          }
        free_blocks_outside_window(*p);
        p->run_reference();
        const std::string where = "W " + std::to_string(W) + " L " + std::to_string(L) + " sink " + std::to_string(sink);
        // float64 means of at most 2W + 3 = 261 values below 1: error <= 261 x 2^-53 < 1e-13. The host's
        // fp32 mean rounds at each of those adds, a random walk of about sqrt(261) x 2^-24 ~ 1e-6.
        for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(p->ref[i], want[i], 1e-13) << where << " i " << i;
        decodegraph::host::paged_attention_v1(p->args);
        EXPECT_TRUE(check_close(s.dtype, p->out.data(), want.data(), 1, 4, 64, 1e-6, 1e-6)) << where << " V1";
        p->poison_out();
        run_host_v2(p->args, 32);
        EXPECT_TRUE(check_close(s.dtype, p->out.data(), want.data(), 1, 4, 64, 1e-6, 1e-6)) << where << " V2";
      }
}

// The host's W against the reference at W - 1 and W + 1: random logits, bf16, a window one token
// off moves the output well past the tolerance (so the grid above can fail on an off-by-one).
TEST(HostWindow, NeighbouringWindowsDifferBeyondTolerance) {
  for (int W : {2, 128, 129})
    for (int L : {W + 1, 2 * W + 3}) {
      ProblemSpec ps;
      ps.spec.num_q_heads = 8;
      ps.spec.num_kv_heads = 2;
      ps.spec.head_size = 64;
      ps.spec.sliding_window = W;
      ps.lens = {L};
      ps.distinct_blocks = true;
      auto p = make_problem(ps);
      decodegraph::host::paged_attention_v1(p->args);
      p->run_reference();
      EXPECT_TRUE(p->check(p->tol())) << "W " << W << " L " << L;
      for (int other : {W - 1, W + 1}) {
        p->args.spec.sliding_window = other;
        p->run_reference();
        EXPECT_FALSE(p->check(p->tol())) << "W " << W << " L " << L << " matched window " << other;
      }
    }
}

// ---------------------------------------------------------------- sinks

// sigma in {-inf, 0, 5, 20} (per head sigma + h % 2 where finite), with and without gpt-oss's
// 128-token window, over sequences spanning up to 40 partitions of 128: a sink counted once per
// partition would shift every output; 20 drives the outputs toward 0.
TEST(HostSinks, V1AndV2MatchReferenceAcrossManyPartitions) {
  for (int W : {0, 128})
    for (float sigma : {-INFINITY, 0.0f, 5.0f, 20.0f})
      for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
        ProblemSpec ps;
        ps.spec.num_q_heads = 16;
        ps.spec.num_kv_heads = 2;
        ps.spec.head_size = 64;
        ps.spec.dtype = dt;
        ps.spec.sliding_window = W;
        ps.lens = {5000, 3001, 129, 1};
        ps.distinct_blocks = true;
        auto p = make_problem(ps);
        free_blocks_outside_window(*p);
        std::vector<float> sinks(16);
        for (int h = 0; h < 16; ++h) sinks[h] = sigma + static_cast<float>(h % 2);
        p->args.sinks = sinks.data();
        p->run_reference();
        const std::string where = "W " + std::to_string(W) + " sigma " + std::to_string(sigma) + " " + to_string(dt);
        if (sigma == 20.0f) {
          double mx = 0;
          for (double r : p->ref) mx = std::max(mx, std::fabs(r));
          EXPECT_LT(mx, 1e-3) << where;  // e^20 against at most 5000 e^|s|, |s| < 2
        }
        decodegraph::host::paged_attention_v1(p->args);
        EXPECT_TRUE(p->check(p->tol())) << where << " V1";
        for (int P : {128, 1024}) {
          p->poison_out();
          run_host_v2(p->args, P);
          EXPECT_TRUE(p->check(p->tol())) << where << " V2 P " << P;
        }
      }
}

// sink = -inf is no sink, bit for bit, in V1 and V2.
TEST(HostSinks, MinusInfinityIsNoSinkBitwise) {
  ProblemSpec ps;
  ps.spec.num_q_heads = 8;
  ps.spec.num_kv_heads = 2;
  ps.lens = {700, 33};
  auto p = make_problem(ps);
  std::vector<float> none(8, -INFINITY);
  for (int P : {0, 128}) {
    p->args.sinks = nullptr;
    P == 0 ? decodegraph::host::paged_attention_v1(p->args) : (void)run_host_v2(p->args, P);
    const Buffer plain = p->out;
    p->poison_out();
    p->args.sinks = none.data();
    P == 0 ? decodegraph::host::paged_attention_v1(p->args) : (void)run_host_v2(p->args, P);
    EXPECT_EQ(std::memcmp(plain.data(), p->out.data(), p->out.bytes), 0) << "P " << P;
  }
}

// ---------------------------------------------------------------- soft-cap

// c in {1, 30, 50} on large-norm q and k (logits in the hundreds: the cap is what bounds them), with
// and without a window. Applying the scale after the tanh, scale * c * tanh(q.k / c), is the right
// formula at cap c * scale (c' tanh(scale q.k / c') with c' = c * scale), so the reference at that
// cap is the wrong order's output: the host must match the right one and miss the wrong one.
TEST(HostSoftcap, MatchesReferenceAndNotTheScaleAfterTanh) {
  for (float cap : {1.0f, 30.0f, 50.0f})
    for (int W : {0, 129})
      for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
        ProblemSpec ps;
        ps.spec.num_q_heads = 8;
        ps.spec.num_kv_heads = dt == DType::kFloat16 ? 2 : 8;
        ps.spec.head_size = 128;
        ps.spec.dtype = dt;
        ps.spec.sliding_window = W;
        ps.spec.logit_softcap = cap;
        ps.lens = {1000, 2001, 17};
        ps.large_logits = true;
        ps.distinct_blocks = true;
        ps.alibi = cap == 30.0f;  // the bias goes in before the tanh
        auto p = make_problem(ps);
        free_blocks_outside_window(*p);
        p->run_reference();
        const std::string where = "cap " + std::to_string(cap) + " W " + std::to_string(W) + " " + to_string(dt);
        decodegraph::host::paged_attention_v1(p->args);
        EXPECT_TRUE(p->check(p->tol())) << where << " V1";
        p->poison_out();
        run_host_v2(p->args, 256);
        EXPECT_TRUE(p->check(p->tol())) << where << " V2";
        p->args.spec.logit_softcap = cap * p->args.spec.effective_scale();
        p->run_reference();
        EXPECT_FALSE(p->check(p->tol())) << where << ": matched the scale applied after the tanh";
      }
}

// ---------------------------------------------------------------- bad input

TEST(Variants, BadWindowCapAndSinksAreNamedAndNothingIsWritten) {
  AttentionSpec s;
  s.sliding_window = -1;
  expect_error([&] { decodegraph::validate_spec(s); }, {"spec.sliding_window", "-1", "window_left = W - 1"});
  s.sliding_window = 0;
  // Past 1e4 the cap's arithmetic costs more precision than fp16 holds, and past ~2.4e38 (c log2 e
  // overflows) or below ~1e-38 (2 log2 e / c overflows) every logit would be NaN: issue 39.
  for (float bad : {-1.0f, NAN, INFINITY, 1e-7f, 2e4f, 1e30f, 3e38f, 1e-39f}) {
    s.logit_softcap = bad;
    expect_error([&] { decodegraph::validate_spec(s); }, {"spec.logit_softcap", "0 (off) or c in [1e-6, 1e4]"});
  }
  for (float good : {0.0f, decodegraph::kMinLogitSoftcap, 30.0f, decodegraph::kMaxLogitSoftcap}) {
    s.logit_softcap = good;
    EXPECT_NO_THROW(decodegraph::validate_spec(s)) << good;
  }

  ProblemSpec ps;
  ps.spec.num_q_heads = 8;
  ps.spec.num_kv_heads = 2;
  ps.lens = {100, 7};
  auto p = make_problem(ps);
  std::vector<float> sinks(8, 1.0f);
  p->args.sinks = sinks.data();
  for (float bad : {INFINITY, NAN}) {
    sinks[3] = bad;
    expect_error([&] { decodegraph::host::paged_attention_v1(p->args); }, {"sinks[3]", "a finite raw logit or -inf"});
    expect_error([&] { run_host_v2(p->args, 64); }, {"sinks[3]"});
    EXPECT_EQ(std::memcmp(p->out.data(), p->poisoned.data(), p->out.bytes), 0);
  }
}

// Out-of-window entries may hold any id; the window's own entries (its first, partly masked block
// included) are still checked.
TEST(Variants, ValidationChecksOnlyTheWindowsEntries) {
  ProblemSpec ps;
  ps.spec.block_size = 16;
  ps.spec.sliding_window = 40;
  ps.lens = {100};  // attends 60..99: blocks 3..6
  ps.distinct_blocks = true;
  auto p = make_problem(ps);
  for (int j = 0; j < 3; ++j) p->tables[j] = -5 - j;
  DecodeArgs a = p->args;
  a.host_seq_lens = p->lens.data();
  a.host_block_tables = p->tables.data();
  EXPECT_NO_THROW(decodegraph::validate_decode_args(a));
  EXPECT_NO_THROW(decodegraph::host::paged_attention_v1(p->args));
  p->tables[3] = -1;
  expect_error([&] { decodegraph::validate_decode_args(a); }, {"block_tables[0][3] = -1"});
  expect_error([&] { decodegraph::host::paged_attention_v1(p->args); }, {"block_tables[0][3] = -1"});
}

// V2's workspace covers the window, not max_seq_len: a 128-token window at 131072 tokens needs the
// partials of ceil((128 + 15) / 64) = 3 partitions of 64, where no window needs 2048.
TEST(Variants, V2WorkspaceCoversTheWindowOnly) {
  AttentionSpec s;
  s.block_size = 16;
  EXPECT_EQ(decodegraph::v2_workspace_layout(s, 4, 131072, 64).max_partitions, 2048);
  s.sliding_window = 128;
  EXPECT_EQ(decodegraph::v2_workspace_layout(s, 4, 131072, 64).max_partitions, 3);
  EXPECT_EQ(decodegraph::v2_workspace_layout(s, 4, 100, 64).max_partitions, 2);
}

// ---------------------------------------------------------------- reads a row does not attend (issue 39)

// The host implementation models the kernels' edge tiles (a masked token never multiplies its V):
// +-inf and NaN at the positions of dgtest::masked_read_cases leave every row that attends none of
// them bitwise as with finite values there and make the others non-finite, in every math, cache
// type and layout, V1 and V2 (tests/gpu/test_gpu_variants.cpp runs the same grid on the kernels).
TEST(HostMaskedReads, NonFiniteValuesAtMaskedPositionsNeverReachARow) {
  int i = 0;
  for (const MaskedRead& c : masked_read_cases())
    for (const MaskedReadConfig& cf : masked_read_configs())
      for (KVLayout layout : {KVLayout::kVLLM, KVLayout::kNHD}) {
        auto p = make_problem(masked_read_problem(c, cf, layout, i));
        const float value = masked_read_value(i++);
        p->run_reference();
        SCOPED_TRACE(std::string(c.name) + ", value " + std::to_string(value) + ", case " + std::to_string(i - 1));
        for (int P : {0, 64}) {
          const auto run = [&] {
            p->poison_out();
            if (P == 0) decodegraph::host::paged_attention_v1(p->args);
            else run_host_v2(p->args, P);
          };
          run();
          ASSERT_TRUE(p->check(p->tol())) << (P ? "V2" : "V1") << " with finite values";
          const auto* o = static_cast<const unsigned char*>(p->out.data());
          const std::vector<unsigned char> clean(o, o + p->poisoned.bytes);
          const Buffer k0 = p->k, v0 = p->v;
          for (const auto& at : c.at) set_cache_value(*p, 0, at.pos, at.key, value);
          run();
          EXPECT_TRUE(check_masked_rows(*p, c, clean)) << (P ? "V2" : "V1");
          p->k = k0;
          p->v = v0;
          p->args.k_cache = p->k.data();
          p->args.v_cache = p->v.data();
        }
      }
}

// A sink sigma far above every logit (dgtest::sink_above_cases): V1 and V2 in every math shift by
// max(sigma, M), so e^(sigma - M) never overflows and the output stays the reference's, to its own
// size where that is a normal float (sigma 80 / 89.5 with V or v_scale at 1e30: 0 before the fix).
TEST(HostSinks, FarAboveEveryLogit) {
  int i = 0;
  for (const SinkAbove& c : sink_above_cases())
    for (float sigma : c.sigmas) {
      auto p = sink_above_problem(c, sigma, i % 2 ? KVLayout::kNHD : KVLayout::kVLLM, i);
      ++i;
      p->run_reference();
      const Tolerance t = sink_above_tolerance(p->args.spec.dtype, sigma, c.v_mag, 300);
      SCOPED_TRACE("sigma " + std::to_string(sigma) + " group " + std::to_string(c.cf.group) + " " +
                   decodegraph::to_string(p->args.spec.dtype) + (p->args.spec.fp8_kv() ? " fp8" : ""));
      p->poison_out();
      decodegraph::host::paged_attention_v1(p->args);
      EXPECT_TRUE(p->check(t)) << "V1";
      p->poison_out();
      run_host_v2(p->args, 64);
      EXPECT_TRUE(p->check(t)) << "V2";
    }
}

}  // namespace
