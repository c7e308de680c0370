// The V2 merge kernel (kernels/merge_partitions.cuh) under the CPU simulator, on partials written
// here (not by pass 1), so that every case the merge must survive can be set up directly: many
// partitions, partition counts around the kernel's chunk sizes (4, 8, 16, 32 groups; 8 partitions
// loaded per group, so 256 per block before a second round), -inf partitions and rows of nothing but
// -inf, large logits, padded rows, one partition, head sizes whose last slice is partial, strided
// output rows. Checked against:
//   - a float64 merge written here in plain loops (M, weights and the weighted mean in double);
//   - the host implementation's merge (kernels::merge_row_in_kernel_order, what host V2 runs),
//     bit for bit: both fold in the order kernels/merge_policy.hpp defines, with the same fmaf and
//     expf, so on the simulator they agree exactly;
//   - itself: the same inputs twice, in forward, reverse and shuffled thread order, and with launches
//     sized for more partitions (more groups per block), all bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "decodegraph/attention.hpp"
#include "decodegraph/numeric.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/merge_partitions.cuh"
#include "kernels/merge_policy.hpp"
#include "sim_runtime.hpp"
#include "test_util.hpp"

#ifndef DECODEGRAPH_SIM
#error "tests/sim must compile against tests/sim/shim, not the CUDA toolkit headers"
#endif

namespace {

using namespace decodegraph;

void sim_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Dev {
  void* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t bytes, const void* src = nullptr) : n(bytes) {
    sim_ok(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)), "cudaMalloc");
    if (src != nullptr) sim_ok(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

// Tolerances against the float64 merge of the same fp32 partials: the output's rounding to the dtype
// (half an ulp: 2^-24, 2^-11, 2^-9 relative) plus fp32 weights and sums over at most ~1100 terms.
struct Tolerance {
  double atol, rtol;
};
Tolerance tol(DType d) {
  switch (d) {
    case DType::kFloat32: return {2e-6, 2e-5};
    case DType::kFloat16: return {1e-4, 1e-3};
    case DType::kBFloat16: return {1e-3, 4e-3};
  }
  return {0, 0};
}

// One merge problem: partials for rows (seq, head) of `lens` at partition size P, laid out like the
// V2 workspace with max_partitions columns, and an output buffer with rows out_stride apart.
struct Problem {
  DType dtype = DType::kFloat32;
  int heads = 2;
  int head_size = 128;
  int partition_size = 16;
  int max_partitions = 0;
  int max_seq_len = 0;
  int64_t out_stride = 0;
  std::vector<int32_t> lens;
  std::vector<float> m, l, o;  // [seqs, heads, max_partitions] (x head_size for o)
  std::vector<float> sinks;    // [heads] attention sinks, or empty for none
  float sink(int head) const { return sinks.empty() ? -INFINITY : sinks[head]; }

  int seqs() const { return static_cast<int>(lens.size()); }
  int parts(int seq) const { return num_partitions(std::min(lens[seq], max_seq_len), partition_size); }
  int64_t index(int seq, int head, int part) const {
    return math::partial_index(seq, head, part, heads, max_partitions);
  }
  std::size_t out_elems() const { return static_cast<std::size_t>(seqs()) * out_stride; }
};

enum class Logits { kNormal, kLarge, kSomeNegInf, kAllNegInf };

// Partials as pass 1 leaves them: l_p >= 1 (the max token contributes 1), o_p a weighted mean of
// values in [-2, 2]; partitions past a row's count hold NaN, which the merge must never read.
Problem make_problem(DType dtype, int heads, int head_size, int P, std::vector<int32_t> lens, Logits logits,
                     std::mt19937_64& rng, int extra_partitions = 0, int64_t stride_pad = 0) {
  Problem pr;
  pr.dtype = dtype;
  pr.heads = heads;
  pr.head_size = head_size;
  pr.partition_size = P;
  pr.lens = std::move(lens);
  pr.max_seq_len = *std::max_element(pr.lens.begin(), pr.lens.end());
  pr.max_partitions = num_partitions(pr.max_seq_len, P) + extra_partitions;
  pr.out_stride = static_cast<int64_t>(heads) * head_size + stride_pad;
  const std::size_t rows = static_cast<std::size_t>(pr.seqs()) * heads * pr.max_partitions;
  pr.m.assign(rows, NAN);
  pr.l.assign(rows, NAN);
  pr.o.assign(rows * head_size, NAN);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f), val(-2.0f, 2.0f), small(-3.0f, 3.0f),
      large(-3000.0f, 3000.0f);
  for (int s = 0; s < pr.seqs(); ++s)
    for (int h = 0; h < heads; ++h)
      for (int p = 0; p < pr.parts(s); ++p) {
        const int64_t i = pr.index(s, h, p);
        bool empty = logits == Logits::kAllNegInf || (logits == Logits::kSomeNegInf && unit(rng) < 0.3f);
        if (empty) {  // a partition with no token seen: what the merge must weigh 0
          pr.m[i] = math::neg_inf();
          pr.l[i] = 0.0f;
          for (int d = 0; d < head_size; ++d) pr.o[i * head_size + d] = 0.0f;
          continue;
        }
        pr.m[i] = logits == Logits::kLarge ? large(rng) : small(rng);
        pr.l[i] = 1.0f + 40.0f * unit(rng);
        for (int d = 0; d < head_size; ++d) pr.o[i * head_size + d] = val(rng);
      }
  return pr;
}

// The merge by definition, in float64: M = max m_p, w_p = l_p exp(m_p - M), out = sum w o / sum w
// (0 where every partition is empty). Padded rows: none.
std::vector<double> reference_merge(const Problem& pr) {
  std::vector<double> ref(static_cast<std::size_t>(pr.seqs()) * pr.heads * pr.head_size, 0.0);
  for (int s = 0; s < pr.seqs(); ++s)
    for (int h = 0; h < pr.heads; ++h) {
      const int n = pr.parts(s);
      if (n == 0) continue;
      // The sink joins the max and (once) the denominator: e^(sink - M).
      double M = pr.sink(h);
      for (int p = 0; p < n; ++p) M = std::max(M, static_cast<double>(pr.m[pr.index(s, h, p)]));
      double W = pr.sink(h) == -INFINITY ? 0.0 : std::exp(double(pr.sink(h)) - M);
      std::vector<double> acc(pr.head_size, 0.0);
      for (int p = 0; p < n; ++p) {
        const int64_t i = pr.index(s, h, p);
        if (pr.m[i] == -INFINITY) continue;
        const double w = static_cast<double>(pr.l[i]) * std::exp(static_cast<double>(pr.m[i]) - M);
        W += w;
        for (int d = 0; d < pr.head_size; ++d) acc[d] += w * pr.o[i * pr.head_size + d];
      }
      for (int d = 0; d < pr.head_size; ++d)
        ref[(static_cast<std::size_t>(s) * pr.heads + h) * pr.head_size + d] = W > 0 ? acc[d] / W : 0.0;
    }
  return ref;
}

// The host implementation's merge of every live row, rounded to the dtype, into a buffer laid out
// like the kernel's output (rows out_stride apart; padded rows keep `fill`).
std::vector<uint8_t> host_merge(const Problem& pr, uint8_t fill) {
  const std::size_t es = dtype_size(pr.dtype);
  std::vector<uint8_t> out(pr.out_elems() * es, fill);
  std::vector<float> row(pr.head_size);
  for (int s = 0; s < pr.seqs(); ++s) {
    const int n = pr.parts(s);
    if (n == 0) continue;
    for (int h = 0; h < pr.heads; ++h) {
      const int64_t i = pr.index(s, h, 0);
      kernels::merge_row_in_kernel_order(&pr.m[i], &pr.l[i], &pr.o[i * pr.head_size], n, pr.head_size, row.data(),
                                         pr.sink(h));
      for (int d = 0; d < pr.head_size; ++d)
        store_from_float(pr.dtype, out.data(), s * pr.out_stride + static_cast<int64_t>(h) * pr.head_size + d, row[d]);
    }
  }
  return out;
}

// Runs the kernel's launcher on the simulator; the output buffer starts as `fill` bytes.
std::vector<uint8_t> device_merge(const Problem& pr, uint8_t fill, int launch_max_partitions = 0) {
  const std::size_t es = dtype_size(pr.dtype);
  Dev m(pr.m.size() * 4, pr.m.data()), l(pr.l.size() * 4, pr.l.data()), o(pr.o.size() * 4, pr.o.data());
  Dev lens(pr.lens.size() * 4, pr.lens.data());
  Dev sinks(pr.sinks.size() * 4, pr.sinks.data());
  std::vector<uint8_t> out(pr.out_elems() * es, fill);
  Dev d_out(out.size(), out.data());
  kernels::MergeParams p;
  p.max_logits = static_cast<const float*>(m.p);
  p.exp_sums = static_cast<const float*>(l.p);
  p.partial_out = static_cast<const float*>(o.p);
  p.out = d_out.p;
  p.seq_lens = static_cast<const int32_t*>(lens.p);
  p.out_stride = pr.out_stride;
  p.num_seqs = pr.seqs();
  p.num_q_heads = pr.heads;
  p.head_size = pr.head_size;
  p.max_seq_len = pr.max_seq_len;
  p.partition_size = pr.partition_size;
  p.max_partitions = pr.max_partitions;
  p.sinks = pr.sinks.empty() ? nullptr : static_cast<const float*>(sinks.p);
  if (launch_max_partitions > 0) {
    // A launch sized for longer rows: more groups per block over the same partials (the workspace
    // keeps its max_partitions; only the block follows launch_max_partitions, as in a graph sized for
    // a longer band than an eager call).
    const dim3 grid(static_cast<unsigned>(p.num_q_heads * p.num_seqs), 1u,
                    static_cast<unsigned>(kernels::merge_slices(p.head_size)));
    const dim3 block(static_cast<unsigned>(kernels::merge_threads(launch_max_partitions)));
    switch (pr.dtype) {
      case DType::kFloat32: sim_launch(kernels::MergePartitionsKernel<float>, grid, block, 0, nullptr, p); break;
      case DType::kFloat16: sim_launch(kernels::MergePartitionsKernel<__half>, grid, block, 0, nullptr, p); break;
      case DType::kBFloat16: sim_launch(kernels::MergePartitionsKernel<__nv_bfloat16>, grid, block, 0, nullptr, p); break;
    }
  } else {
    switch (pr.dtype) {
      case DType::kFloat32: kernels::launch_merge_partitions<float>(p, nullptr); break;
      case DType::kFloat16: kernels::launch_merge_partitions<__half>(p, nullptr); break;
      case DType::kBFloat16: kernels::launch_merge_partitions<__nv_bfloat16>(p, nullptr); break;
    }
  }
  sim_ok(cudaDeviceSynchronize(), "merge");
  sim_ok(cudaMemcpy(out.data(), d_out.p, out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

// Device output rows packed as [seqs, heads, head_size] for check_close.
std::vector<uint8_t> packed(const Problem& pr, const std::vector<uint8_t>& out) {
  const std::size_t es = dtype_size(pr.dtype);
  const std::size_t row = static_cast<std::size_t>(pr.heads) * pr.head_size * es;
  std::vector<uint8_t> p(static_cast<std::size_t>(pr.seqs()) * row);
  for (int s = 0; s < pr.seqs(); ++s) std::memcpy(&p[s * row], &out[s * pr.out_stride * es], row);
  return p;
}

int first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int>(i);
  return -1;
}

constexpr uint8_t kFill = 0x7f;  // every output byte the kernel does not write keeps it

// Checks one problem every way: float64 reference, host merge bitwise, rows it must not touch
// (padded rows and the stride's gap), and (determinism) a second run bitwise.
void check_problem(const Problem& pr, const std::string& what) {
  SCOPED_TRACE(what);
  const std::vector<uint8_t> dev = device_merge(pr, kFill);
  const std::vector<uint8_t> host = host_merge(pr, kFill);
  EXPECT_EQ(first_difference(dev, host), -1) << "device and host merges differ (first differing byte)";
  std::vector<bool> live(pr.seqs());
  for (int s = 0; s < pr.seqs(); ++s) live[s] = pr.parts(s) > 0;
  const Tolerance t = tol(pr.dtype);
  const std::vector<double> ref = reference_merge(pr);
  const std::vector<uint8_t> rows = packed(pr, dev);
  EXPECT_TRUE(dgtest::check_close(pr.dtype, rows.data(), ref.data(), pr.seqs(), pr.heads, pr.head_size, t.atol, t.rtol,
                                  live));
  // Untouched: padded rows whole, and the gap past each row's heads.
  const std::size_t es = dtype_size(pr.dtype);
  for (int s = 0; s < pr.seqs(); ++s) {
    const std::size_t from = live[s] ? static_cast<std::size_t>(pr.heads) * pr.head_size * es : 0;
    for (std::size_t b = from; b < static_cast<std::size_t>(pr.out_stride) * es; ++b)
      if (dev[s * pr.out_stride * es + b] != kFill) {
        ADD_FAILURE() << "seq " << s << " byte " << b << " written (padded row or stride gap)";
        break;
      }
  }
  EXPECT_EQ(first_difference(dev, device_merge(pr, kFill)), -1) << "a second run differs";
}

// ---------------------------------------------------------------- cases

// Partition counts around every size the kernel's split changes at: groups of 4, 8, 16, 32 (one per
// partition up to 32), 8 partitions per group per round (256 at 32 groups), plus long rows that
// read their maxima in a second loop. Several lengths per batch, so that one launch holds rows of
// different counts (and blocks of one launch fold different numbers of partitions).
TEST(SimMerge, PartitionCountsAroundTheChunkSizes) {
  std::mt19937_64 rng(19);
  const std::vector<std::vector<int>> counts = {
      {1, 2, 3},          {4, 5},   {7, 8, 9},          {15, 16, 17},        {31, 32, 33},
      {63, 64, 65, 1},    {127, 128}, {255, 256, 257},  {511, 512, 513, 300}, {1023, 1100, 2},
  };
  for (const auto& c : counts) {
    const int P = 16;
    std::vector<int32_t> lens;
    for (int n : c) lens.push_back((n - 1) * P + 1 + static_cast<int>(rng() % P));  // n partitions
    const Problem pr = make_problem(DType::kFloat32, 2, 64, P, lens, Logits::kNormal, rng);
    std::string name = "counts";
    for (int n : c) name += " " + std::to_string(n);
    check_problem(pr, name);
  }
}

// Attention sinks (issue 17) join the denominator once per row, in the merge: with 1 partition (then
// merged, not copied), a few, and more than one round of loads; sinks below, near and far above the
// partitions' maxima (20 above drives the row toward 0), -inf (none) on some heads.
TEST(SimMerge, SinksJoinTheDenominatorOnce) {
  std::mt19937_64 rng(23);
  for (DType dt : {DType::kFloat32, DType::kBFloat16})
    for (float sigma : {0.0f, 5.0f, 20.0f, -30.0f}) {
      const int P = 16;
      Problem pr = make_problem(dt, 4, 64, P, {1, 2 * P, 33 * P - 3, 300 * P}, Logits::kNormal, rng);
      pr.sinks = {sigma, -INFINITY, sigma + 1.5f, sigma - 2.0f};
      check_problem(pr, std::string(to_string(dt)) + " sink " + std::to_string(sigma));
    }
}

// Every dtype and head size: the slices of 32 elements, with a partial last slice at 80 and 112.
TEST(SimMerge, DtypesAndHeadSizes) {
  std::mt19937_64 rng(20);
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int d : {64, 80, 96, 112, 128, 192, 256}) {
      const Problem pr = make_problem(dt, 2, d, 32, {32 * 40 + 5, 1, 32 * 3}, Logits::kNormal, rng);
      check_problem(pr, std::string(to_string(dt)) + " head " + std::to_string(d));
    }
}

// Partitions that saw no token (m = -inf, l = 0) weigh 0; a row of nothing but such partitions
// comes out as 0, never NaN. Large logits (spread over +-3000) leave most weights at exactly 0 and
// stress the max subtraction.
TEST(SimMerge, NegInfPartitionsAndLargeLogits) {
  std::mt19937_64 rng(21);
  for (Logits lg : {Logits::kSomeNegInf, Logits::kAllNegInf, Logits::kLarge}) {
    const Problem pr = make_problem(DType::kBFloat16, 3, 128, 16, {16 * 37, 16 * 300 + 3, 16 * 2, 16 * 9 - 1}, lg, rng);
    check_problem(pr, "logits " + std::to_string(static_cast<int>(lg)));
  }
  // An all -inf row merges to exact zeros.
  const Problem pr = make_problem(DType::kFloat32, 1, 64, 16, {16 * 50}, Logits::kAllNegInf, rng);
  const std::vector<uint8_t> out = device_merge(pr, kFill);
  for (int d = 0; d < 64; ++d) EXPECT_EQ(load_as_float(DType::kFloat32, out.data(), d), 0.0f) << d;
}

// Padded rows (length 0) are not written; lengths past max_seq_len are clamped to it (the partials
// of the clamped count are all there is); rows are out_stride elements apart with a gap between.
TEST(SimMerge, PaddedRowsClampAndStridedRows) {
  std::mt19937_64 rng(22);
  Problem pr = make_problem(DType::kFloat16, 2, 96, 32, {0, 32 * 20 + 1, 0, 7, 32 * 64}, Logits::kNormal, rng, 0,
                            /*stride_pad=*/40);
  check_problem(pr, "padded and strided");
  // Clamp: the last row claims twice max_seq_len; the kernel merges max_seq_len's partitions.
  pr.lens.back() = 2 * pr.max_seq_len;
  check_problem(pr, "clamped");
}

// The same bits whatever the thread order (forward, reverse, shuffled between sync points) and
// however large the launch's blocks (a launch sized for 4, 100 or 2000 partitions: 4 to 32 groups),
// so eager (sized for its own max_seq_len) and graph (sized for the band) agree bit for bit.
TEST(SimMerge, BitwiseAcrossThreadOrdersAndLaunchSizes) {
  std::mt19937_64 rng(23);
  const Problem pr = make_problem(DType::kBFloat16, 2, 80, 16, {16 * 3, 16 * 4, 16 * 2 + 5, 1}, Logits::kSomeNegInf, rng);
  const Problem longer = make_problem(DType::kFloat32, 2, 64, 16, {16 * 70, 16 * 9, 16 * 33}, Logits::kNormal, rng);
  for (const Problem* p : {&pr, &longer}) {
    sim::set_order(sim::Order::kForward);
    const std::vector<uint8_t> base = device_merge(*p, kFill);
    sim::set_order(sim::Order::kReverse);
    EXPECT_EQ(first_difference(base, device_merge(*p, kFill)), -1) << "reverse order";
    sim::set_order(sim::Order::kShuffle);
    EXPECT_EQ(first_difference(base, device_merge(*p, kFill)), -1) << "shuffled order";
    sim::set_order(sim::Order::kFromEnv);
    for (int launch : {p->max_partitions, 100, 2000})
      EXPECT_EQ(first_difference(base, device_merge(*p, kFill, launch)), -1) << "launch for " << launch;
  }
}

// The launcher's shape: one group per partition up to 32 (at least 4), 8 threads per group, one
// block per 32 head elements.
// More rows than a grid dimension y holds (issue 39): 65541 rows of one head, two partitions each
// (the fold path). The merge's grid was (heads, rows, slices) and failed past 65535 rows (the
// simulator refuses such a launch as the GPU does); it is (rows x heads, 1, slices).
TEST(SimMerge, MoreThan65535RowsInOneLaunch) {
  std::mt19937_64 rng(39);
  check_problem(make_problem(DType::kBFloat16, 1, 32, 16, std::vector<int32_t>(65541, 20), Logits::kNormal, rng),
                "65541 rows");
}

TEST(SimMerge, LaunchShape) {
  EXPECT_EQ(kernels::merge_groups(1), 4);
  EXPECT_EQ(kernels::merge_groups(4), 4);
  EXPECT_EQ(kernels::merge_groups(5), 8);
  EXPECT_EQ(kernels::merge_groups(17), 32);
  EXPECT_EQ(kernels::merge_groups(5000), 32);
  EXPECT_EQ(kernels::merge_threads(200), 256);
  EXPECT_EQ(kernels::merge_slices(64), 2);
  EXPECT_EQ(kernels::merge_slices(80), 3);
  EXPECT_EQ(kernels::merge_slices(128), 4);
  EXPECT_EQ(kernels::merge_slices(256), 8);
}

}  // namespace
