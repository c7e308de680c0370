// Host V1 / V2 against the float64 reference: the supported grid (sampled so every value of every
// axis appears), irregular and long lengths, large logits, partition-size independence, the
// multi-partition merge (docs/design.md's known trap), padded rows, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "problem.hpp"

namespace {

using namespace dgtest;
using decodegraph::num_partitions;

// ---------------------------------------------------------------- the sampled grid

struct GridCase {
  DType dtype;
  int head_size, block_size, ratio, partition_size;
  KVLayout layout;
  bool alibi, custom_scale;
  int batch;
  uint64_t seed;
};

std::string grid_name(const ::testing::TestParamInfo<GridCase>& info) {
  const GridCase& c = info.param;
  return std::to_string(info.index) + "_" + decodegraph::to_string(c.dtype) + "_d" +
         std::to_string(c.head_size) + "_b" + std::to_string(c.block_size) + "_g" +
         std::to_string(c.ratio) + "_P" + std::to_string(c.partition_size) + "_" +
         decodegraph::to_string(c.layout) + (c.alibi ? "_alibi" : "") +
         (c.custom_scale ? "_scale" : "") + "_n" + std::to_string(c.batch);
}

// Each axis gets a shuffled column in which every value appears at least N / |axis| times, so the
// cases cover every value of every axis with varied combinations.
std::vector<GridCase> make_grid() {
  constexpr int N = 84;
  std::mt19937_64 rng(20240611);
  auto column = [&](auto values) {
    std::vector<typename decltype(values)::value_type> col;
    while (static_cast<int>(col.size()) < N) col.insert(col.end(), values.begin(), values.end());
    col.resize(N);
    std::shuffle(col.begin(), col.end(), rng);
    return col;
  };
  const auto dt = column(std::vector<DType>{DType::kFloat16, DType::kBFloat16, DType::kFloat32});
  const auto hs = column(std::vector<int>{64, 80, 96, 112, 128, 192, 256});
  const auto bs = column(std::vector<int>{8, 16, 32});
  const auto ratio = column(std::vector<int>{1, 2, 4, 5, 8, 16});
  const auto part = column(std::vector<int>{256, 512, 1024, 2048});
  const auto layout = column(std::vector<KVLayout>{KVLayout::kVLLM, KVLayout::kNHD});
  const auto alibi = column(std::vector<bool>{false, true});
  const auto scale = column(std::vector<bool>{false, true, false});
  const auto batch = column(std::vector<int>{1, 7, 17});
  std::vector<GridCase> cases;
  for (int i = 0; i < N; ++i)
    cases.push_back({dt[i], hs[i], bs[i], ratio[i], part[i], layout[i], alibi[i], scale[i],
                     batch[i], 1000u + static_cast<uint64_t>(i)});
  return cases;
}

class HostGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(HostGrid, V1AndV2MatchReference) {
  const GridCase& c = GetParam();
  ProblemSpec ps;
  ps.spec.dtype = c.dtype;
  ps.spec.head_size = c.head_size;
  ps.spec.block_size = c.block_size;
  ps.spec.layout = c.layout;
  ps.spec.num_kv_heads = (c.ratio >= 8 ? 1 : 2) * (1 + static_cast<int>(c.seed % 2));
  ps.spec.num_q_heads = ps.spec.num_kv_heads * c.ratio;
  ps.spec.scale = c.custom_scale ? 0.37f : 0.0f;
  ps.alibi = c.alibi;
  ps.seed = c.seed;
  ps.extra_stride = static_cast<int>(c.seed % 3);

  // Irregular lengths around the block and partition edges, plus random ones; batches of 7 and 17
  // also get a padded row.
  const int B = c.block_size, P = c.partition_size;
  const std::vector<int> edges = {1, B - 1, B, B + 1, P - 1, P, P + 1, 2 * P + 3};
  std::mt19937_64 rng(c.seed);
  std::uniform_int_distribution<int> any_len(1, 4 * P);
  for (int i = 0; i < c.batch; ++i) {
    if (c.batch > 1 && i == 2) {
      ps.lens.push_back(0);
    } else if (c.batch == 1) {
      ps.lens.push_back(edges[c.seed % edges.size()]);
    } else {
      // The first rows take edge lengths; the rest of a batch of 17 random ones (halved to keep
      // the float64 reference cheap).
      ps.lens.push_back(i <= static_cast<int>(edges.size()) ? edges[(i + c.seed) % edges.size()]
                                                            : any_len(rng) / 2 + 1);
    }
  }
  if (c.seed % 2) ps.max_seq_len = *std::max_element(ps.lens.begin(), ps.lens.end()) + 37;

  auto p = make_problem(ps);
  p->run_reference();

  decodegraph::host::paged_attention_v1(p->args);
  EXPECT_TRUE(p->check(p->tol())) << "V1";
  EXPECT_TRUE(p->padded_rows_untouched()) << "V1";

  p->poison_out();
  run_host_v2(p->args, P);
  EXPECT_TRUE(p->check(p->tol())) << "V2, P = " << P;
  EXPECT_TRUE(p->padded_rows_untouched()) << "V2";
}

INSTANTIATE_TEST_SUITE_P(Sampled, HostGrid, ::testing::ValuesIn(make_grid()), grid_name);

// Every axis value must occur in the sampled grid (guards against an edit that drops one).
TEST(HostGridCoverage, EveryAxisValueAppears) {
  const auto g = make_grid();
  auto has = [&](auto pred) { return std::any_of(g.begin(), g.end(), pred); };
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32})
    EXPECT_TRUE(has([&](const GridCase& c) { return c.dtype == d; }));
  for (int h : decodegraph::kSupportedHeadSizes)
    EXPECT_TRUE(has([&](const GridCase& c) { return c.head_size == h; })) << h;
  for (int b : decodegraph::kSupportedBlockSizes)
    EXPECT_TRUE(has([&](const GridCase& c) { return c.block_size == b; })) << b;
  for (int r : {1, 2, 4, 5, 8, 16}) EXPECT_TRUE(has([&](const GridCase& c) { return c.ratio == r; }));
  for (int P : {256, 512, 1024, 2048})
    EXPECT_TRUE(has([&](const GridCase& c) { return c.partition_size == P; }));
  for (KVLayout l : {KVLayout::kVLLM, KVLayout::kNHD})
    EXPECT_TRUE(has([&](const GridCase& c) { return c.layout == l; }));
  for (bool a : {false, true}) EXPECT_TRUE(has([&](const GridCase& c) { return c.alibi == a; }));
  for (bool s : {false, true})
    EXPECT_TRUE(has([&](const GridCase& c) { return c.custom_scale == s; }));
  for (int n : {1, 7, 17}) EXPECT_TRUE(has([&](const GridCase& c) { return c.batch == n; }));
}

// ---------------------------------------------------------------- long and irregular lengths

struct LongCase {
  DType dtype;
  int head_size, block_size, kv_heads, ratio, partition_size;
  KVLayout layout;
  bool alibi;
  std::vector<int> lens;
};

class HostLong : public ::testing::TestWithParam<LongCase> {};

TEST_P(HostLong, V1AndV2MatchReference) {
  const LongCase& c = GetParam();
  ProblemSpec ps;
  ps.spec.dtype = c.dtype;
  ps.spec.head_size = c.head_size;
  ps.spec.block_size = c.block_size;
  ps.spec.num_kv_heads = c.kv_heads;
  ps.spec.num_q_heads = c.kv_heads * c.ratio;
  ps.spec.layout = c.layout;
  ps.alibi = c.alibi;
  ps.lens = c.lens;
  ps.seed = 77 + c.head_size;
  auto p = make_problem(ps);
  p->run_reference();

  decodegraph::host::paged_attention_v1(p->args);
  EXPECT_TRUE(p->check(p->tol())) << "V1";
  p->poison_out();
  run_host_v2(p->args, c.partition_size);
  EXPECT_TRUE(p->check(p->tol())) << "V2, P = " << c.partition_size;
}

// Lengths 8191/8192/8193 straddle the default V1/V2 threshold; > 32768 and 20+ partitions for the
// merge. Few heads keep the float64 reference affordable.
INSTANTIATE_TEST_SUITE_P(
    Lengths, HostLong,
    ::testing::Values(
        LongCase{DType::kBFloat16, 128, 16, 1, 4, 512, KVLayout::kVLLM, false, {8191, 8192, 8193}},
        LongCase{DType::kFloat16, 64, 32, 2, 1, 256, KVLayout::kNHD, true, {6000, 1, 8193}},
        LongCase{DType::kFloat32, 256, 8, 1, 2, 2048, KVLayout::kVLLM, false, {8192, 257}},
        LongCase{DType::kFloat16, 64, 16, 2, 4, 1024, KVLayout::kVLLM, false, {40000, 32769, 25000}},
        LongCase{DType::kFloat32, 112, 32, 1, 5, 2048, KVLayout::kNHD, true, {100000, 8191}},
        LongCase{DType::kBFloat16, 80, 32, 1, 1, 512, KVLayout::kNHD, true, {65537}},
        LongCase{DType::kFloat32, 64, 16, 1, 1, 256, KVLayout::kNHD, false, {32768, 33000}}),
    [](const ::testing::TestParamInfo<LongCase>& info) {
      return std::to_string(info.index) + "_" + decodegraph::to_string(info.param.dtype) + "_d" +
             std::to_string(info.param.head_size) + "_maxlen" +
             std::to_string(*std::max_element(info.param.lens.begin(), info.param.lens.end()));
    });

// ---------------------------------------------------------------- large-magnitude logits

class HostLargeLogits : public ::testing::TestWithParam<DType> {};

TEST_P(HostLargeLogits, MaxSubtractionKeepsResultsFinite) {
  ProblemSpec ps;
  ps.spec.dtype = GetParam();
  ps.spec.head_size = 128;
  ps.spec.block_size = 16;
  ps.spec.num_kv_heads = 2;
  ps.spec.num_q_heads = 4;
  ps.large_logits = true;
  ps.alibi = true;
  ps.lens = {1, 17, 255, 256, 257, 1500, 3000};
  ps.seed = 5;
  auto p = make_problem(ps);
  p->run_reference();

  // The inputs must produce logits far beyond exp's fp32 range (|s| > 88), or this tests nothing:
  // mean |q . k| * scale over q row 0 and random 128-element stretches of the K cache.
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<std::size_t> start(0, p->args.num_blocks * ps.spec.block_elems() - 128);
  double mean_abs_logit = 0;
  for (int i = 0; i < 64; ++i) {
    const std::size_t k0 = start(rng);
    double dot = 0;
    for (int e = 0; e < 128; ++e)
      dot += decodegraph::load_as_float(ps.spec.dtype, p->q.data(), e) *
             decodegraph::load_as_float(ps.spec.dtype, p->k.data(), k0 + e);
    mean_abs_logit += std::fabs(dot * ps.spec.effective_scale()) / 64;
  }
  EXPECT_GT(mean_abs_logit, 88.0);

  decodegraph::host::paged_attention_v1(p->args);
  EXPECT_TRUE(p->check(p->tol())) << "V1";
  p->poison_out();
  run_host_v2(p->args, 256);
  EXPECT_TRUE(p->check(p->tol())) << "V2";
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, HostLargeLogits,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32),
                         [](const auto& info) { return decodegraph::to_string(info.param); });

// ---------------------------------------------------------------- partition size, V1 == V2

TEST(HostV2, IndependentOfPartitionSize) {
  ProblemSpec ps;
  ps.spec.dtype = DType::kFloat32;
  ps.spec.head_size = 96;
  ps.spec.block_size = 32;
  ps.spec.num_kv_heads = 1;
  ps.spec.num_q_heads = 5;
  ps.alibi = true;
  ps.lens = {5000, 2049, 31, 1024};
  ps.seed = 9;
  auto p = make_problem(ps);
  p->run_reference();
  const std::size_t n = p->out_elems;

  std::vector<double> first;
  for (int P : {256, 512, 1024, 2048}) {
    p->poison_out();
    run_host_v2(p->args, P);
    ASSERT_TRUE(p->check(tolerance(DType::kFloat32))) << "P = " << P;
    std::vector<double> o(n);
    for (std::size_t i = 0; i < n; ++i)
      o[i] = decodegraph::load_as_float(DType::kFloat32, p->out.data(), i);
    if (first.empty()) {
      first = o;
      continue;
    }
    // Different P, different summation order: equal within fp32 accumulation error.
    EXPECT_TRUE(check_close(DType::kFloat32, p->out.data(), first.data(), 4, 5, 96, 1e-5, 1e-4))
        << "P = " << P << " against P = 256";
  }
}

TEST(HostV2, SinglePartitionEqualsV1Bitwise) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    ProblemSpec ps;
    ps.spec.dtype = dt;
    ps.spec.head_size = 112;
    ps.spec.block_size = 8;
    ps.spec.num_kv_heads = 2;
    ps.spec.num_q_heads = 16;
    ps.lens = {1, 7, 8, 9, 511, 512};
    auto p = make_problem(ps);
    decodegraph::host::paged_attention_v1(p->args);
    const auto bytes = p->out.bytes;
    std::vector<unsigned char> v1(bytes);
    std::memcpy(v1.data(), p->out.data(), bytes);
    p->poison_out();
    run_host_v2(p->args, 512);
    EXPECT_EQ(std::memcmp(v1.data(), p->out.data(), bytes), 0) << decodegraph::to_string(dt);
  }
}

TEST(HostAttention, RepeatedRunsAreBitwiseIdentical) {
  ProblemSpec ps;
  ps.spec.dtype = DType::kBFloat16;
  ps.spec.num_kv_heads = 2;
  ps.spec.num_q_heads = 8;
  ps.lens = {3000, 700, 0, 1};
  auto p = make_problem(ps);
  for (int v2 = 0; v2 < 2; ++v2) {
    std::vector<unsigned char> a(p->out.bytes), b(p->out.bytes);
    p->poison_out();
    v2 ? (void)run_host_v2(p->args, 512) : decodegraph::host::paged_attention_v1(p->args);
    std::memcpy(a.data(), p->out.data(), a.size());
    p->poison_out();
    v2 ? (void)run_host_v2(p->args, 512) : decodegraph::host::paged_attention_v1(p->args);
    std::memcpy(b.data(), p->out.data(), b.size());
    EXPECT_EQ(a, b) << (v2 ? "V2" : "V1");
  }
}

// ---------------------------------------------------------------- the merge (docs/design.md's known trap)

// Partition 0 holds a few tokens with much larger logits than the rest, so the partitions' exp sums
// differ by orders of magnitude: a merge that weights unnormalised partials by l_p is far off here.
TEST(HostV2Merge, MultiPartitionMergeMatchesReferenceAndPartialsAreNormalised) {
  ProblemSpec ps;
  ps.spec.dtype = DType::kFloat32;
  ps.spec.head_size = 64;
  ps.spec.block_size = 16;
  ps.spec.num_kv_heads = 1;
  ps.spec.num_q_heads = 1;  // one head, so the crafted keys stand out for it
  ps.spec.layout = KVLayout::kNHD;
  ps.lens = {3 * 256 + 40};  // 4 partitions of 256, the last one short
  ps.distinct_blocks = true;
  ps.seed = 21;
  auto p = make_problem(ps);
  const AttentionSpec& s = ps.spec;
  auto* k = static_cast<float*>(p->k.data());
  // q . k = 3 * sum|q| for the first 5 tokens of partition 0: logits ~ 3 * 32 / 8 = 12 above the rest.
  for (int t = 0; t < 5; ++t) {
    const int64_t blk = p->tables[t / 16];
    for (int d = 0; d < 64; ++d) {
      const float qd = static_cast<const float*>(p->q.data())[d];
      k[(blk * 16 + t % 16) * 64 + d] = qd > 0 ? 3.f : -3.f;
    }
  }
  p->run_reference();

  const int P = 256;
  const auto ws = run_host_v2(p->args, P);
  ASSERT_TRUE(p->check(tolerance(DType::kFloat32)));

  const auto w = decodegraph::v2_workspace_layout(s, 1, p->args.max_seq_len, P);
  ASSERT_EQ(w.max_partitions, 4);
  const auto* bytes = reinterpret_cast<const unsigned char*>(ws.data());
  const auto* m = reinterpret_cast<const float*>(bytes + w.max_logits_offset);
  const auto* l = reinterpret_cast<const float*>(bytes + w.exp_sums_offset);
  const auto* o = reinterpret_cast<const float*>(bytes + w.partial_out_offset);

  const int h = 0;  // the only query head
  {
    double M = -INFINITY, L = 0;
    std::vector<double> wrong(64, 0.0);
    for (int part = 0; part < 4; ++part) {
      const int idx = h * 4 + part;
      // Each partial equals the reference over that partition's tokens alone (softmax is shift
      // invariant, so a sub-range reference with its own length is the same normalised output).
      const int t0 = part * P, n = std::min(P, p->lens[0] - t0);
      decodegraph::DecodeArgs sub = p->args;
      std::vector<int32_t> sub_table(p->tables.begin() + t0 / 16, p->tables.end());
      sub_table.resize(p->args.block_table_stride, -1);
      const int32_t sub_len = n;
      sub.block_tables = sub_table.data();
      sub.seq_lens = &sub_len;
      std::vector<double> sub_ref(64);
      decodegraph::reference::paged_attention(sub, sub_ref.data());
      float po[64];
      std::memcpy(po, o + static_cast<std::size_t>(idx) * 64, sizeof po);
      EXPECT_TRUE(check_close(DType::kFloat32, po, sub_ref.data(), 1, 1, 64, 2e-5, 1e-4))
          << "partition " << part;
      M = std::max(M, double(m[idx]));
    }
    for (int part = 0; part < 4; ++part) L += l[h * 4 + part] * std::exp(m[h * 4 + part] - M);
    // The trap: weighting unnormalised partials (o_p * l_p) by w_p again.
    for (int part = 0; part < 4; ++part) {
      const int idx = h * 4 + part;
      const double wp = l[idx] * std::exp(m[idx] - M);
      for (int d = 0; d < 64; ++d) wrong[d] += wp * (o[idx * 64 + d] * l[idx]) / L;
    }
    double wrong_err = 0;
    for (int d = 0; d < 64; ++d) wrong_err = std::max(wrong_err, std::fabs(wrong[d] - p->ref[h * 64 + d]));
    EXPECT_GT(wrong_err, 0.05) << "the inputs do not separate a right merge from the trap";
    EXPECT_GT(m[0] - m[1], 8.0) << "partition 0 should dominate by far";
  }
}

// ---------------------------------------------------------------- padded rows

TEST(HostAttention, PaddedRowsUntouched) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    ProblemSpec ps;
    ps.spec.dtype = dt;
    ps.spec.head_size = 80;
    ps.spec.num_kv_heads = 2;
    ps.spec.num_q_heads = 4;
    ps.lens = {0, 5, 0, 300, 0, 0, 17};
    ps.max_seq_len = 1024;
    auto p = make_problem(ps);
    p->run_reference();
    decodegraph::host::paged_attention_v1(p->args);
    EXPECT_TRUE(p->padded_rows_untouched());
    EXPECT_TRUE(p->check(tolerance(dt)));
    p->poison_out();
    run_host_v2(p->args, 256);
    EXPECT_TRUE(p->padded_rows_untouched());
    EXPECT_TRUE(p->check(tolerance(dt)));
  }
}

TEST(HostAttention, AllRowsPaddedWritesNothing) {
  ProblemSpec ps;
  ps.lens = {0, 0, 0};
  ps.max_seq_len = 64;
  auto p = make_problem(ps);
  decodegraph::host::paged_attention_v1(p->args);
  EXPECT_TRUE(p->padded_rows_untouched());
  run_host_v2(p->args, 32);
  EXPECT_TRUE(p->padded_rows_untouched());
}

// ---------------------------------------------------------------- host-content checks

TEST(HostAttention, RejectsBadLengthsBeforeWritingAnything) {
  ProblemSpec ps;
  ps.lens = {10, 20, 30};
  auto p = make_problem(ps);
  for (int bad : {-1, 31}) {
    p->lens[2] = bad;
    try {
      decodegraph::host::paged_attention_v1(p->args);
      ADD_FAILURE() << "no error for seq_len " << bad;
    } catch (const decodegraph::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("seq_lens[2]"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("0 .. max_seq_len = 0 .. 30"), std::string::npos) << msg;
    }
    EXPECT_THROW(run_host_v2(p->args, 32), decodegraph::Error);
    // Validation runs before any work: the whole output still holds the poison.
    EXPECT_EQ(std::memcmp(p->out.data(), p->poisoned.data(), p->out.bytes), 0);
  }
}

TEST(HostAttention, RejectsBlockIdsOutOfRangeInUsedEntriesOnly) {
  ProblemSpec ps;
  ps.spec.block_size = 16;
  ps.lens = {10, 40};
  ps.extra_stride = 2;
  ps.num_blocks = 8;
  auto p = make_problem(ps);
  const int stride = p->args.block_table_stride;
  // Unused entries (beyond the length) may hold anything.
  p->tables[0 * stride + 1] = 12345;
  p->tables[1 * stride + 4] = -7;
  EXPECT_NO_THROW(decodegraph::host::paged_attention_v1(p->args));
  p->tables[1 * stride + 2] = 8;
  try {
    decodegraph::host::paged_attention_v1(p->args);
    ADD_FAILURE() << "no error for block id 8";
  } catch (const decodegraph::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("block_tables[1][2] = 8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("0 .. 7"), std::string::npos) << msg;
  }
}

TEST(HostAttention, V2RejectsMissingOrSmallWorkspace) {
  ProblemSpec ps;
  ps.lens = {100, 300};
  auto p = make_problem(ps);
  const std::size_t need = decodegraph::v2_workspace_size(p->args.spec, 2, 300, 64);
  std::vector<std::uint64_t> ws(need / 8 + 2);
  try {
    decodegraph::host::paged_attention_v2(p->args, 64, ws.data(), need - 1);
    ADD_FAILURE() << "no error for a small workspace";
  } catch (const decodegraph::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("workspace_bytes = " + std::to_string(need - 1)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(need)), std::string::npos) << msg;
  }
  try {
    decodegraph::host::paged_attention_v2(p->args, 64, nullptr, need);
    ADD_FAILURE() << "no error for a null workspace";
  } catch (const decodegraph::Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace = null"), std::string::npos) << e.what();
  }
  try {
    decodegraph::host::paged_attention_v2(p->args, 40, ws.data(), need);
    ADD_FAILURE() << "no error for partition size 40";
  } catch (const decodegraph::Error& e) {
    EXPECT_NE(std::string(e.what()).find("partition_size = 40"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::memcmp(p->out.data(), p->poisoned.data(), p->out.bytes), 0);
}

}  // namespace
