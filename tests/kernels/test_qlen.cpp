// Several query tokens per sequence (issue 18, speculative decoding's verify step) on the host
// implementation against the float64 reference, and the reference against closed forms and its own
// single-token case. Row j of a q_len-n step of a sequence of L tokens sits at position L - n + j and
// attends t <= L - n + j (and t > L - n + j - W with a window).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "problem.hpp"

namespace {

using namespace dgtest;
using decodegraph::DType;

/// Runs fn, which must throw decodegraph::Error naming `param` and containing `detail`.
template <class F>
::testing::AssertionResult rejects(F&& fn, const std::string& param, const std::string& detail) {
  try {
    fn();
  } catch (const decodegraph::Error& e) {
    const std::string m = e.what();
    if (m.find(param) == std::string::npos || m.find(detail) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << m << "\" lacks \"" << param << "\" or \"" << detail << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "nothing thrown; expected an error naming " << param;
}

struct QCase {
  int n, len, index;
};

std::vector<QCase> q_cases() {
  std::vector<QCase> out;
  int i = 0;
  for (int n : {1, 2, 3, 4, 5, 8})
    for (int L : {n, n + 1, 127, 8191, 8192 + n, 30000}) out.push_back({n, L, i++});
  return out;
}

class HostQLen : public ::testing::TestWithParam<QCase> {};

// Every (n, L) of the issue with a second, shorter sequence, against the float64 reference. The GQA
// group (1, 4, 8: n x group rows choose the math, as the launcher does), dtype, layout and block size
// rotate; every third case adds a 128-token window (its freed blocks poisoned), sinks, a soft-cap
// and ALiBi. V2 at two partition sizes (30000 spans 59 partitions of 512).
TEST_P(HostQLen, V1AndV2MatchReference) {
  const QCase c = GetParam();
  const DType dtypes[] = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
  const int groups[] = {1, 4, 8};
  ProblemSpec ps;
  ps.spec.num_q_heads = 8;
  ps.spec.num_kv_heads = 8 / groups[c.index % 3];
  ps.spec.head_size = 64;
  ps.spec.block_size = c.index % 2 ? 16 : 32;
  ps.spec.dtype = dtypes[(c.index / 3) % 3];
  ps.spec.layout = c.index % 4 < 2 ? KVLayout::kVLLM : KVLayout::kNHD;
  const bool variants = c.index % 3 == 2;
  if (variants) {
    ps.spec.sliding_window = 128;
    ps.spec.logit_softcap = 30.0f;
    ps.alibi = true;
  }
  ps.q_len = c.n;
  ps.lens = {c.len, std::max(c.n, c.len / 3)};
  ps.distinct_blocks = true;
  ps.seed = 1800 + c.index;
  auto p = make_problem(ps);
  free_blocks_outside_window(*p);
  std::vector<float> sinks;
  if (variants) {
    for (int h = 0; h < 8; ++h) sinks.push_back(h % 2 ? 1.5f : -INFINITY);
    p->set_sinks(sinks);
  }
  p->run_reference();
  const std::string where = "n " + std::to_string(c.n) + " L " + std::to_string(c.len);
  decodegraph::host::paged_attention_v1(p->args);
  EXPECT_TRUE(p->check(p->tol())) << where << " V1";
  for (int P : {128, 512}) {
    p->poison_out();
    run_host_v2(p->args, P);
    EXPECT_TRUE(p->check(p->tol())) << where << " V2 P " << P;
  }
}

INSTANTIATE_TEST_SUITE_P(Issue18, HostQLen, ::testing::ValuesIn(q_cases()),
                         [](const ::testing::TestParamInfo<QCase>& i) {
                           return "n" + std::to_string(i.param.n) + "_L" + std::to_string(i.param.len);
                         });

/// A small fp32 problem of n rows per sequence (head 64, blocks of 8, window W): the closed forms'.
ProblemSpec fp32_rows(int q_heads, int kv_heads, int W, int n) {
  ProblemSpec ps;
  ps.spec.num_q_heads = q_heads;
  ps.spec.num_kv_heads = kv_heads;
  ps.spec.head_size = 64;
  ps.spec.block_size = 8;
  ps.spec.dtype = DType::kFloat32;
  ps.spec.sliding_window = W;
  ps.q_len = n;
  return ps;
}

// The reference's row j is its single-token case at length L - n + 1 + j with that row's q: the
// same loops, so equal exactly (this pins the row layout and the per-row length, both ways).
TEST(ReferenceQLen, RowJIsTheSingleTokenCaseAtItsOwnLength) {
  for (int W : {0, 5})
    for (int n : {2, 5, 8}) {
      ProblemSpec ps = fp32_rows(4, 2, W, n);
      ps.alibi = true;
      ps.lens = {n + 13, n};
      auto p = make_problem(ps);
      p->run_reference();
      const std::size_t row = 4 * 64;
      for (int s = 0; s < 2; ++s)
        for (int j = 0; j < n; ++j) {
          DecodeArgs one = p->args;
          one.q_len = 1;
          one.num_seqs = 1;
          const int len = p->lens[s] - n + 1 + j;
          one.seq_lens = &len;
          one.block_tables = p->tables.data() + static_cast<std::size_t>(s) * p->args.block_table_stride;
          one.q = static_cast<const float*>(p->q.data()) + (static_cast<std::size_t>(s) * n + j) * row;
          std::vector<double> want(row);
          decodegraph::reference::paged_attention(one, want.data());
          for (std::size_t i = 0; i < row; ++i)
            ASSERT_EQ(p->ref[(static_cast<std::size_t>(s) * n + j) * row + i], want[i])
                << "W " << W << " n " << n << " seq " << s << " row " << j << " i " << i;
        }
    }
}

// Zero keys make every logit 0: row j's output is the mean of V over the positions it attends,
// t in (L - n + j - W, L - n + j], summed here with its own index arithmetic (NHD fp32). A top-left
// aligned mask (row j attending t <= j) or a row attending all L tokens gives other means.
TEST(ReferenceQLen, ZeroKeysAverageTheRowsOwnPositions) {
  for (int W : {0, 3})
    for (int n : {2, 4, 8}) {
      const int L = n + 9;
      ProblemSpec ps = fp32_rows(2, 1, W, n);
      ps.spec.layout = KVLayout::kNHD;
      ps.lens = {L};
      ps.distinct_blocks = true;
      auto p = make_problem(ps);
      std::memset(p->k.data(), 0, p->k.bytes);
      p->run_reference();
      const auto* v = static_cast<const float*>(p->v.data());
      for (int j = 0; j < n; ++j) {
        const int pos = L - n + j, first = W > 0 ? std::max(0, pos + 1 - W) : 0;
        for (int h = 0; h < 2; ++h)
          for (int d = 0; d < 64; ++d) {
            double want = 0.0;
            for (int t = first; t <= pos; ++t) want += v[(p->tables[t / 8] * 8 + t % 8) * 64 + d];
            want /= pos - first + 1;
            // float64 sums of at most 17 values in (-1, 1), the same terms as `want` in another order:
            // |error| <= 17 x 2^-53 x 17 < 1e-13.
            ASSERT_NEAR(p->ref[(static_cast<std::size_t>(j) * 2 + h) * 64 + d], want, 1e-13)
                << "W " << W << " n " << n << " row " << j;
          }
      }
      decodegraph::host::paged_attention_v1(p->args);
      // fp32: every weight is exactly 1 (2^0), so the host's error is that of an fp32 mean of at most
      // 17 values below 1 in magnitude: at most 17 x 2^-24 ~ 1e-6 absolute.
      EXPECT_TRUE(p->check(Tolerance{1e-6, 1e-6})) << "host V1, W " << W << " n " << n;
    }
}

// A host implementation that attends every position (no per-row causal mask) fails the grid: the
// reference at q_len 1 for every row (each row seeing all L tokens) differs beyond the tolerance.
TEST(HostQLen, AMaskOffByOneRowDiffersBeyondTolerance) {
  ProblemSpec ps;
  ps.spec.num_q_heads = 8;
  ps.spec.num_kv_heads = 2;
  ps.spec.head_size = 64;
  ps.q_len = 4;
  ps.lens = {300};
  auto p = make_problem(ps);
  decodegraph::host::paged_attention_v1(p->args);
  p->run_reference();
  EXPECT_TRUE(p->check(p->tol()));
  // The same rows, each attending one more position (as if every row sat at p_j + 1).
  std::vector<int32_t> longer = {301};
  DecodeArgs shifted = p->args;
  shifted.max_seq_len = 301;
  shifted.seq_lens = longer.data();
  std::vector<int32_t> table(p->tables);
  table.resize(table.size() + 1, table[0]);
  shifted.block_table_stride = p->args.block_table_stride + 1;
  shifted.block_tables = table.data();
  std::vector<double> ref(p->ref.size());
  decodegraph::reference::paged_attention(shifted, ref.data());
  EXPECT_FALSE(check_close(ps.spec.dtype, p->out.data(), ref.data(), 4, 8, 64, p->tol().atol, p->tol().rtol));
}

// Bad input: q_len outside 1 .. kMaxQLen and a sequence shorter than q_len are named; the V2
// workspace grows with q_len.
TEST(ValidateQLen, BadQLenAndShortSequencesAreNamed) {
  ProblemSpec ps;
  ps.spec.num_q_heads = 4;
  ps.spec.num_kv_heads = 1;
  ps.spec.head_size = 64;
  ps.q_len = 4;
  ps.lens = {40, 4};
  auto p = make_problem(ps);
  for (int bad : {0, -1, decodegraph::kMaxQLen + 1}) {
    DecodeArgs a = p->args;
    a.q_len = bad;
    EXPECT_TRUE(rejects([&] { decodegraph::validate_decode_args(a); }, "q_len", std::to_string(bad)));
  }
  p->lens[1] = 3;
  EXPECT_TRUE(rejects([&] { decodegraph::host::paged_attention_v1(p->args); }, "seq_lens[1]", "q_len = 4"));
  DecodeArgs a = p->args;
  a.host_seq_lens = p->lens.data();
  EXPECT_TRUE(rejects([&] { decodegraph::validate_decode_args(a); }, "seq_lens[1]", "q_len = 4"));
  p->lens[1] = 0;  // a padded sequence stays valid
  EXPECT_NO_THROW(decodegraph::validate_decode_args(a));
  const AttentionSpec& s = p->args.spec;
  EXPECT_GT(decodegraph::v2_workspace_size(s, 2, 40, 16, 4), decodegraph::v2_workspace_size(s, 2, 40, 16, 1));
  EXPECT_TRUE(rejects([&] { decodegraph::v2_workspace_size(s, 2, 40, 16, 0); }, "q_len", "0"));
}

}  // namespace
