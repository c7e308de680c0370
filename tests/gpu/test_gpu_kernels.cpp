// GPU tests of the eager kernels: V1 and V2 (pass 1 + merge) against the float64 reference over
// the supported grid, irregular and long lengths, odd batches, large logits, partition-size
// independence, determinism, padded rows, the vLLM-shaped case, GQA groups above 16 (head
// chunks), the tensor-core math's group shapes, -inf in the K chunk the padded k-steps of heads 80
// and 112 would read, NaN in cache slots past the lengths, caches past 2^31 elements, the KV append against
// the host append and explicit layout offsets, the naive kernel, the length clamp, the
// kernel-launch fault seam, a fused QKV buffer read through row strides, padded rows with host
// lengths, block ids outside the cache (clamped, reported through bad_block), and append slots
// that are not their position's or past the cache (skipped, reported through bad_slot). The
// attention variants and q_len rows are in test_gpu_variants.cpp.
// Every test starts with DG_REQUIRE_GPU(): without a device it reports itself skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "device_problem.hpp"
#include "kernels/naive.hpp"
#include "test_util.hpp"

namespace {

using namespace dggpu;

// ---------------------------------------------------------------- grid

// 42 cases: every (dtype, head_size) pair, every block size, layout and group size (1, 2, 4, 5, 8,
// 16), with ALiBi and padded rows on some. V2 runs with small partitions so most rows span several.
TEST(GpuKernels, SampledGridMatchesReference) {
  DG_REQUIRE_GPU();
  const int heads[] = {64, 80, 96, 112, 128, 192, 256};
  const int blocks[] = {8, 16, 32};
  const int groups[] = {1, 2, 4, 5, 8, 16};
  std::mt19937_64 rng(2024);
  for (int i = 0; i < 42; ++i) {
    const int bs = blocks[(i / 2) % 3];
    const int g = groups[i % 6];
    ProblemSpec ps;
    ps.spec = make_spec(kDTypes[i % 3], heads[i % 7], bs, kLayouts[i % 2], 2 * g, 2);
    std::uniform_int_distribution<int> len(1, 700);
    ps.lens = {len(rng), len(rng), (i % 4 == 0) ? 0 : len(rng), len(rng)};
    ps.alibi = i % 5 == 0;
    ps.seed = 100 + i;
    auto p = dgtest::make_problem(ps);
    p->run_reference();
    SCOPED_TRACE("case " + std::to_string(i) + ": " + describe(ps.spec));
    check_all(*p, {4 * bs, 256});
  }
}

// ---------------------------------------------------------------- lengths and batches

// Lengths around block and partition edges, around the 8192 V1/V2 threshold, and past 32768.
TEST(GpuKernels, IrregularLengths) {
  DG_REQUIRE_GPU();
  const int P = 512;
  for (DType dt : kDTypes) {
    for (KVLayout layout : kLayouts) {
      const int bs = dt == DType::kFloat16 ? 16 : dt == DType::kBFloat16 ? 32 : 8;
      ProblemSpec ps;
      ps.spec = make_spec(dt, 128, bs, layout, 8, 2);
      ps.lens = {1, bs - 1, bs, bs + 1, P - 1, P, P + 1, 8191, 8192, 8193, 33000};
      ps.alibi = layout == KVLayout::kNHD;
      ps.seed = 7 + static_cast<int>(dt) * 2 + static_cast<int>(layout);
      auto p = dgtest::make_problem(ps);
      p->run_reference();
      check_all(*p, {P});
    }
  }
}

// Odd batch sizes, some padded rows, and max_seq_len above every length (a band's upper edge):
// blocks of partitions past each length must exit without disturbing the merge.
TEST(GpuKernels, OddBatchesWithPaddedRows) {
  DG_REQUIRE_GPU();
  std::mt19937_64 rng(77);
  for (int batch : {1, 7, 17}) {
    ProblemSpec ps;
    ps.spec = make_spec(DType::kBFloat16, 128, 16, KVLayout::kVLLM, 32, 8);
    std::uniform_int_distribution<int> len(1, 3000);
    for (int s = 0; s < batch; ++s) ps.lens.push_back((batch > 1 && s % 5 == 3) ? 0 : len(rng));
    ps.max_seq_len = 4096;
    ps.seed = batch;
    auto p = dgtest::make_problem(ps);
    p->run_reference();
    SCOPED_TRACE("batch " + std::to_string(batch));
    check_all(*p, {256});
  }
}

// Sequences spanning 20+ partitions (the merge trap: unnormalised partials weighted again).
TEST(GpuKernels, ManyPartitions) {
  DG_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    ProblemSpec ps;
    ps.spec = make_spec(dt, 64, 16, KVLayout::kNHD, 4, 4);
    ps.lens = {20 * 256 + 7, 24 * 256, 3};
    ps.seed = 31;
    auto p = dgtest::make_problem(ps);
    p->run_reference();
    check_all(*p, {256}, /*with_v1=*/false);
  }
}

TEST(GpuKernels, LargeMagnitudeLogits) {
  DG_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    for (KVLayout layout : kLayouts) {
      ProblemSpec ps;
      ps.spec = make_spec(dt, 128, 16, layout, 8, 2);
      ps.lens = {1, 700, 5000};
      ps.large_logits = true;
      ps.seed = 90;
      auto p = dgtest::make_problem(ps);
      p->run_reference();
      check_all(*p, {256, 1024});
    }
  }
}

// V2 output must not depend on the partition size beyond rounding.
TEST(GpuKernels, V2IndependentOfPartitionSize) {
  DG_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    ProblemSpec ps;
    ps.spec = make_spec(dt, 128, 16, KVLayout::kVLLM, 16, 2);
    ps.lens = {9000, 3000, 1, 2049};
    ps.seed = 5;
    auto p = dgtest::make_problem(ps);
    p->run_reference();
    DeviceProblem dp(*p);
    const Tolerance t = gpu_tol(dt);
    std::vector<double> first;
    for (int P : {256, 512, 1024, 2048}) {
      dp.run_v2(P);
      EXPECT_TRUE(p->check(t)) << "P=" << P;
      if (first.empty()) {
        first.resize(p->out_elems);
        for (std::size_t i = 0; i < p->out_elems; ++i) first[i] = load_as_float(dt, p->out.data(), i);
      } else {
        EXPECT_TRUE(dgtest::check_close(dt, p->out.data(), first.data(), static_cast<int>(ps.lens.size()), 16, 128,
                                        2 * t.atol, 2 * t.rtol))
            << "P=" << P << " vs P=256";
      }
    }
  }
}

TEST(GpuKernels, RepeatedRunsBitwiseIdentical) {
  DG_REQUIRE_GPU();
  ProblemSpec ps;
  ps.spec = make_spec(DType::kFloat16, 128, 16, KVLayout::kVLLM, 32, 8);
  ps.lens = {9000, 0, 17, 20000, 512};
  ps.seed = 3;
  auto p = dgtest::make_problem(ps);
  DeviceProblem dp(*p);
  dp.run_v1();
  const auto v1a = dp.out_bytes();
  dp.run_v1();
  EXPECT_EQ(v1a, dp.out_bytes()) << "V1 runs differ";
  dp.run_v2(512);
  const auto v2a = dp.out_bytes();
  dp.run_v2(512);
  EXPECT_EQ(v2a, dp.out_bytes()) << "V2 runs differ";
  p->run_reference();
  EXPECT_TRUE(p->check(gpu_tol(DType::kFloat16)));  // and the runs are right, not just stable
}

// vLLM's test shape: 7 sequences, heads (40, 40) and (64, 8), random lengths, the last >= 40000.
TEST(GpuKernels, VllmShapedBatch) {
  DG_REQUIRE_GPU();
  std::mt19937_64 rng(40000);
  for (auto [qh, kvh] : {std::pair{40, 40}, std::pair{64, 8}}) {
    ProblemSpec ps;
    ps.spec = make_spec(DType::kFloat16, 128, 16, KVLayout::kVLLM, qh, kvh);
    std::uniform_int_distribution<int> len(1, 40000);
    for (int s = 0; s < 6; ++s) ps.lens.push_back(len(rng));
    ps.lens.push_back(std::uniform_int_distribution<int>(40000, 48000)(rng));
    ps.seed = qh;
    auto p = dgtest::make_problem(ps);
    p->run_reference();
    SCOPED_TRACE("heads " + std::to_string(qh) + "/" + std::to_string(kvh));
    check_all(*p, {512});
  }
}

// GQA groups above the 16 heads one block serves split into head chunks along grid y (32 = two
// full chunks, 24 = a full and a partial one), for every dtype and both layouts.
TEST(GpuKernels, LargeGroupsSplitIntoHeadChunks) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (DType dt : kDTypes) {
    for (KVLayout layout : kLayouts) {
      for (auto [qh, kvh] : {std::pair{32, 1}, std::pair{48, 2}}) {
        ProblemSpec ps;
        ps.spec = make_spec(dt, i % 2 ? 256 : 80, 16, layout, qh, kvh);
        ps.lens = {1, 0, 300, 1100};
        ps.alibi = i % 3 == 1;
        ps.seed = 500 + i++;
        auto p = dgtest::make_problem(ps);
        p->run_reference();
        SCOPED_TRACE(describe(ps.spec));
        check_all(*p, {256});
      }
    }
  }
}

// The tensor-core pass 1 (fp16 / bf16, groups >= 4): groups 4, 5 (3 of 8 mma rows per half
// padded), 8, 16 (every row real) and 24 (two chunks of 12) on both layouts, head sizes whose
// k-steps and d-tiles do not split evenly over the warps (80, 96, 112) among them, ALiBi on some.
TEST(GpuKernels, TensorCoreGroupShapes) {
  DG_REQUIRE_GPU();
  const int heads[] = {128, 80, 64, 256, 112, 96, 192};
  int i = 0;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (KVLayout layout : kLayouts) {
      for (int g : {4, 5, 8, 16, 24}) {
        ProblemSpec ps;
        ps.spec = make_spec(dt, heads[i % 7], i % 3 == 0 ? 8 : 16, layout, g * (g > 16 ? 1 : 2), g > 16 ? 1 : 2);
        ps.lens = {1, 0, 47, 300};
        ps.alibi = i % 4 == 1;
        ps.seed = 900 + i++;
        auto p = dgtest::make_problem(ps);
        p->run_reference();
        SCOPED_TRACE(describe(ps.spec));
        check_all(*p, {64});
      }
    }
  }
}

// Head sizes 80 and 112 split D / 16 k-steps unevenly over the tensor-core warps, so the last warp's
// share runs past D; its ldmatrix rows there are clamped to the last real K chunk. A key holding
// -inf in that chunk (with q > 0 there, so q.k = -inf: weight 0 in the reference) must not meet
// the padded step's q = 0 (0 * -inf = NaN): the kernel skips those k-steps (issue 20).
TEST(GpuKernels, InfInLastKChunkOfPaddedHeadSizes) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (KVLayout layout : kLayouts) {
      for (int D : {80, 112}) {
        ProblemSpec ps;
        ps.spec = make_spec(dt, D, 16, layout, 8, 2);  // GQA 4: tensor cores
        ps.lens = {40, 1, 300};
        ps.distinct_blocks = true;
        ps.seed = 1300 + i++;
        auto p = dgtest::make_problem(ps);
        const AttentionSpec& s = ps.spec;
        for (std::size_t e = D - 1; e < p->out_elems; e += D) store_from_float(dt, p->q.data(), e, 0.5f);
        const int64_t H = s.num_kv_heads, B = s.block_size, x = 16 / static_cast<int64_t>(dtype_size(dt));
        int infs = 0;
        for (int sq = 0; sq < static_cast<int>(ps.lens.size()); ++sq)
          for (int t = 1; t < ps.lens[sq]; t += 3)  // token 0 of each sequence stays finite
            for (int64_t h = 0; h < H; ++h) {
              const int64_t blk = p->tables[sq * p->args.block_table_stride + t / B], off = t % B, e = D - 1;
              const int64_t ko = layout == KVLayout::kNHD ? ((blk * B + off) * H + h) * D + e
                                                          : (((blk * H + h) * (D / x) + e / x) * B + off) * x + e % x;
              store_from_float(dt, p->k.data(), ko, -INFINITY);
              ++infs;
            }
        ASSERT_GT(infs, 100);
        p->run_reference();
        SCOPED_TRACE(describe(s));
        check_all(*p, {64});
      }
    }
  }
}

// Cache slots past each length (the tail of a sequence's last block) and unused blocks hold NaN, as
// stale device memory may: the kernels must zero-fill / mask them (0 * NaN would poison the sum).
TEST(GpuKernels, NaNPastTheEndIsIgnored) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (DType dt : kDTypes) {
    for (KVLayout layout : kLayouts) {
      ProblemSpec ps;
      ps.spec = make_spec(dt, i % 2 ? 64 : 128, i % 3 == 0 ? 32 : 16, layout, 8, 2);
      ps.lens = {1, 0, 100, 517, 65};
      ps.distinct_blocks = true;  // a block's tail belongs to no other sequence
      ps.num_blocks = 64;         // unused blocks too
      ps.seed = 700 + i++;
      auto p = dgtest::make_problem(ps);
      const AttentionSpec& s = ps.spec;
      const int64_t H = s.num_kv_heads, B = s.block_size, D = s.head_size;
      const int64_t x = 16 / static_cast<int64_t>(dtype_size(dt));
      std::vector<bool> used_slot(static_cast<std::size_t>(ps.num_blocks) * B, false);
      for (int sq = 0; sq < static_cast<int>(ps.lens.size()); ++sq)
        for (int t = 0; t < ps.lens[sq]; ++t)
          used_slot[static_cast<std::size_t>(p->tables[sq * p->args.block_table_stride + t / B]) * B + t % B] = true;
      for (int64_t blk = 0; blk < ps.num_blocks; ++blk)
        for (int64_t off = 0; off < B; ++off) {
          if (used_slot[blk * B + off]) continue;
          for (int64_t h = 0; h < H; ++h)
            for (int64_t e = 0; e < D; ++e) {
              const int64_t ko = layout == KVLayout::kNHD ? ((blk * B + off) * H + h) * D + e
                                                          : (((blk * H + h) * (D / x) + e / x) * B + off) * x + e % x;
              const int64_t vo = layout == KVLayout::kNHD ? ko : ((blk * H + h) * D + e) * B + off;
              store_from_float(dt, p->k.data(), ko, NAN);
              store_from_float(dt, p->v.data(), vo, NAN);
            }
        }
      p->run_reference();
      SCOPED_TRACE(describe(s));
      check_all(*p, {2 * s.block_size, 256});
    }
  }
}

// Caches past 2^31 elements: the problem's blocks are placed at block ids above 2^31 / block_elems
// on the device (the rest of the cache is never read), so any 32-bit offset arithmetic reads the
// wrong memory. Skipped where the device cannot hold the two ~4.5 GB caches.
TEST(GpuKernels, CacheOffsetsPast32Bits) {
  DG_REQUIRE_GPU();
  for (KVLayout layout : kLayouts) {
    ProblemSpec ps;
    ps.spec = make_spec(DType::kFloat16, 128, 16, layout, 16, 8);
    ps.lens = {300, 45};
    ps.seed = 900 + static_cast<int>(layout);
    auto p = dgtest::make_problem(ps);
    p->run_reference();
    const std::size_t block_bytes = ps.spec.block_elems() * dtype_size(ps.spec.dtype);
    const int64_t shift = (int64_t{1} << 31) / static_cast<int64_t>(ps.spec.block_elems()) + 1000;
    const int num_blocks = static_cast<int>(shift) + p->args.num_blocks;
    const std::size_t cache_bytes = static_cast<std::size_t>(num_blocks) * block_bytes;
    void* big_k = nullptr;
    void* big_v = nullptr;
    if (cudaMalloc(&big_k, cache_bytes) != cudaSuccess || cudaMalloc(&big_v, cache_bytes) != cudaSuccess) {
      cudaFree(big_k);
      (void)cudaGetLastError();
      GTEST_SKIP() << "device cannot hold two caches of " << cache_bytes << " bytes";
    }
    std::unique_ptr<void, decltype(&cudaFree)> hold_k(big_k, &cudaFree), hold_v(big_v, &cudaFree);
    const std::size_t off = static_cast<std::size_t>(shift) * block_bytes;
    CUDA_OK(cudaMemcpy(static_cast<char*>(big_k) + off, p->k.data(), p->k.bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(static_cast<char*>(big_v) + off, p->v.data(), p->v.bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(big_k, 0, off));  // a wrapped offset would read these zeros
    CUDA_OK(cudaMemset(big_v, 0, off));
    DeviceProblem dp(*p);
    std::vector<int32_t> shifted = p->tables;
    for (int32_t& b : shifted)
      if (b >= 0) b += static_cast<int32_t>(shift);
    dp.tables->upload(shifted.data(), shifted.size() * sizeof(int32_t));
    dp.args.k_cache = big_k;
    dp.args.v_cache = big_v;
    dp.args.num_blocks = num_blocks;
    SCOPED_TRACE(describe(ps.spec));
    const Tolerance t = gpu_tol(ps.spec.dtype);
    dp.run_v1();
    EXPECT_TRUE(p->check(t)) << "V1";
    dp.run_v2(64);
    EXPECT_TRUE(p->check(t)) << "V2";
    dp.run_naive();
    EXPECT_TRUE(p->check(t)) << "naive";
  }
}

// A length above max_seq_len is clamped to it on the device (never read past the table row).
TEST(GpuKernels, LengthAboveMaxIsClamped) {
  DG_REQUIRE_GPU();
  ProblemSpec ps;
  ps.spec = make_spec(DType::kFloat32, 64, 16, KVLayout::kNHD, 4, 2);
  ps.lens = {1000, 600};
  ps.seed = 11;
  auto p = dgtest::make_problem(ps);  // max_seq_len = 1000, table rows sized for it
  p->run_reference();
  DeviceProblem dp(*p);
  const std::vector<int32_t> too_long = {1000 + 500, 600};
  dp.lens->upload(too_long.data(), too_long.size() * sizeof(int32_t));
  dp.args.host_seq_lens = nullptr;  // the launcher cannot see device lengths
  dp.run_v1();
  EXPECT_TRUE(p->check(gpu_tol(DType::kFloat32)));
  dp.run_v2(256);
  EXPECT_TRUE(p->check(gpu_tol(DType::kFloat32)));
}

// ---------------------------------------------------------------- naive kernel

TEST(GpuKernels, NaiveKernelMatchesReferenceAndV1) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (DType dt : kDTypes) {
    for (KVLayout layout : kLayouts) {
      ProblemSpec ps;
      ps.spec = make_spec(dt, i % 2 ? 80 : 128, i % 2 ? 8 : 32, layout, 10, 2);
      ps.lens = {1, 333, 0, 2500};
      ps.alibi = i % 3 == 0;
      ps.seed = 60 + i++;
      auto p = dgtest::make_problem(ps);
      p->run_reference();
      DeviceProblem dp(*p);
      const Tolerance t = gpu_tol(dt);
      dp.run_naive();
      EXPECT_TRUE(p->check(t)) << "naive " << describe(ps.spec);
      EXPECT_TRUE(p->padded_rows_untouched()) << "naive";
      std::vector<double> naive(p->out_elems, 0.0);
      for (std::size_t e = 0; e < p->out_elems; ++e) naive[e] = load_as_float(dt, p->out.data(), e);
      dp.run_v1();
      EXPECT_TRUE(dgtest::check_close(dt, p->out.data(), naive.data(), 4, 10, ps.spec.head_size,
                                      2 * t.atol, 2 * t.rtol, p->mask))
          << "V1 vs naive " << describe(ps.spec);
    }
  }
}

// ---------------------------------------------------------------- KV append

TEST(GpuKernels, AppendKvMatchesHostAppend) {
  DG_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    for (KVLayout layout : kLayouts) {
      for (int D : {64, 80, 256}) {
        const AttentionSpec s = make_spec(dt, D, 16, layout, 8, 4);
        const int num_blocks = 9, num_tokens = 13;
        std::mt19937_64 rng(D + static_cast<int>(dt));
        const std::size_t cn = static_cast<std::size_t>(num_blocks) * s.block_elems();
        const std::size_t tn = static_cast<std::size_t>(num_tokens) * s.num_kv_heads * D;
        auto kc = dgtest::make_buffer(dt, cn), vc = dgtest::make_buffer(dt, cn);
        auto key = dgtest::make_buffer(dt, tn), value = dgtest::make_buffer(dt, tn);
        dgtest::fill_uniform(dt, kc.data(), cn, rng);
        dgtest::fill_uniform(dt, vc.data(), cn, rng);
        dgtest::fill_uniform(dt, key.data(), tn, rng, -3.f, 3.f);
        dgtest::fill_uniform(dt, value.data(), tn, rng, -3.f, 3.f);
        std::vector<int64_t> slots(num_blocks * 16);
        for (std::size_t j = 0; j < slots.size(); ++j) slots[j] = static_cast<int64_t>(j);
        std::shuffle(slots.begin(), slots.end(), rng);
        slots.resize(num_tokens);  // distinct slots
        slots[2] = -1;             // padding tokens are skipped
        slots[9] = -1;

        DevBuf dk(kc.bytes), dv(vc.bytes), dkey(key.bytes), dval(value.bytes), dslots(slots.size() * 8);
        dk.upload(kc.data(), kc.bytes);
        dv.upload(vc.data(), vc.bytes);
        dkey.upload(key.data(), key.bytes);
        dval.upload(value.data(), value.bytes);
        dslots.upload(slots.data(), slots.size() * 8);

        AppendArgs a;
        a.spec = s;
        a.num_tokens = num_tokens;
        a.num_blocks = num_blocks;
        a.key = key.data();
        a.value = value.data();
        a.k_cache = kc.data();
        a.v_cache = vc.data();
        a.slot_mapping = slots.data();
        a.host_slot_mapping = slots.data();
        host::append_kv(a);

        AppendArgs d = a;
        d.key = dkey.ptr;
        d.value = dval.ptr;
        d.k_cache = dk.ptr;
        d.v_cache = dv.ptr;
        d.slot_mapping = static_cast<const int64_t*>(dslots.ptr);
        append_kv(d, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        auto gk = dgtest::make_buffer(dt, cn), gv = dgtest::make_buffer(dt, cn);
        dk.download(gk.data(), gk.bytes);
        dv.download(gv.data(), gv.bytes);
        const std::string what = describe(s);
        EXPECT_EQ(0, std::memcmp(gk.data(), kc.data(), kc.bytes)) << "K cache differs: " << what;
        EXPECT_EQ(0, std::memcmp(gv.data(), vc.data(), vc.bytes)) << "V cache differs: " << what;
        // The host append shares math::k_offset / v_offset with the kernel, so the layouts are also
        // checked here with strides spelled out from types.hpp.
        const int64_t H = s.num_kv_heads, B = s.block_size, x = 16 / static_cast<int64_t>(dtype_size(dt));
        int mismatches = 0;
        for (int t = 0; t < num_tokens; ++t) {
          if (slots[t] < 0) continue;
          const int64_t blk = slots[t] / B, off = slots[t] % B;
          for (int64_t h = 0; h < H; ++h)
            for (int64_t e = 0; e < D; ++e) {
              const std::size_t src = (static_cast<std::size_t>(t) * H + h) * D + e;
              const int64_t ko = layout == KVLayout::kNHD ? ((blk * B + off) * H + h) * D + e
                                                          : (((blk * H + h) * (D / x) + e / x) * B + off) * x + e % x;
              const int64_t vo = layout == KVLayout::kNHD ? ko : ((blk * H + h) * D + e) * B + off;
              mismatches += load_as_float(dt, gk.data(), ko) != load_as_float(dt, key.data(), src);
              mismatches += load_as_float(dt, gv.data(), vo) != load_as_float(dt, value.data(), src);
            }
        }
        EXPECT_EQ(mismatches, 0) << "appended K/V not at their layout offsets: " << what;
      }
    }
  }
}

// ---------------------------------------------------------------- fp8 KV caches
// The float64 reference reads the same codes, times the same scales, as the kernels (the numerical
// contract's reference too): these check the kernels, not the quantisation, at the output dtype's
// tolerance and, under the simulator, the per-element bound (numerics.hpp: the fp16 tensor-core
// path). The quantisation against unquantised data is tests/kernels/test_fp8.cpp's.

constexpr KVCacheDType kFp8Kinds[] = {KVCacheDType::kFp8E4M3, KVCacheDType::kFp8E5M2};

AttentionSpec fp8_spec(KVCacheDType kv, DType dt, int head_size, int block_size, KVLayout layout, int q_heads,
                       int kv_heads, bool per_head = false) {
  AttentionSpec s = make_spec(dt, head_size, block_size, layout, q_heads, kv_heads);
  s.kv_dtype = kv;
  s.kv_scale_per_head = per_head;
  return s;
}

// Every head size, both layouts, both formats and model dtypes, GQA 1 / 4 / 8, every block size
// and the scale rules (k 0.5 / v 0.25; amax / 256 per layer; amax / 256 per KV head) in rotation;
// lengths 1, bs - 1, bs + 1, P - 1, P + 1 and several partitions, a padded row; V1 and V2.
TEST(GpuKernels, Fp8Grid) {
  DG_REQUIRE_GPU();
  const int heads[] = {64, 80, 96, 112, 128, 192, 256};
  const int groups[] = {1, 4, 8};
  int i = 0;
  for (KVCacheDType kv : kFp8Kinds)
    for (DType dt : {DType::kBFloat16, DType::kFloat16})
      for (KVLayout layout : kLayouts)
        for (int D : heads) {
          const int bs = 8 << (i % 3), g = groups[(i / 3) % 3], rule = (i + i / 9) % 3;
          ProblemSpec ps;
          ps.spec = fp8_spec(kv, dt, D, bs, layout, 2 * g, 2, rule == 2);
          if (rule > 0) ps.k_scale = ps.v_scale = 0.0f;  // amax / 256
          ps.lens = {1, bs - 1, 0, bs + 1, 63, 65, 3 * 64 + 5};
          ps.alibi = i % 4 == 1;
          ps.distinct_blocks = i % 2 == 0;
          ps.seed = 3000 + i++;
          auto p = dgtest::make_problem(ps);
          p->run_reference();
          SCOPED_TRACE(describe(ps.spec) + " " + to_string(kv) + " scales " + std::to_string(p->k_scales[0]) + "/" +
                       std::to_string(p->v_scales[0]) + (rule == 2 ? " per head" : ""));
          check_all(*p, {64, 2 * bs});
        }
}

// K and V far beyond max * scale: the codes saturate at +-max (448, 57344); the reference reads
// them as stored, so the kernels must read the saturated codes as they are (no inf, no NaN).
TEST(GpuKernels, Fp8SaturatedCodes) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (KVCacheDType kv : kFp8Kinds)
    for (KVLayout layout : kLayouts) {
      ProblemSpec ps;
      ps.spec = fp8_spec(kv, i % 2 ? DType::kFloat16 : DType::kBFloat16, 128, 16, layout, 8, 2);
      // Scales that put the largest code at |K| = 8 and |V| = 1 (the ordinary tests' magnitudes, so
      // their tolerances hold), and values 40x that: most codes saturate.
      const float max = kv == KVCacheDType::kFp8E4M3 ? 448.0f : 57344.0f;
      ps.k_scale = 8.0f / max;
      ps.v_scale = 1.0f / max;
      ps.kv_magnitude = 40.0f;
      ps.lens = {1, 200, 517};
      ps.seed = 3100 + i++;
      auto p = dgtest::make_problem(ps);
      const uint8_t max_code = kv == KVCacheDType::kFp8E4M3 ? 0x7e : 0x7b;
      std::size_t saturated = 0;
      for (std::size_t e = 0; e < p->v.bytes; ++e) saturated += (static_cast<const uint8_t*>(p->v.data())[e] & 0x7f) == max_code;
      ASSERT_GT(saturated, p->v.bytes / 4) << "the data do not saturate";
      p->run_reference();
      SCOPED_TRACE(describe(ps.spec) + " " + to_string(kv));
      check_all(*p, {64});
    }
}

// Around the V1/V2 threshold and past 100,000 tokens (out of the CI simulator subset: minutes).
TEST(GpuKernels, Fp8LongSequences) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (KVCacheDType kv : kFp8Kinds)
    for (KVLayout layout : kLayouts) {
      ProblemSpec ps;
      ps.spec = fp8_spec(kv, i % 2 ? DType::kBFloat16 : DType::kFloat16, 128, 16, layout, 8, 2);
      ps.lens = {8191, 8192, 8193, 100003};
      ps.seed = 3200 + i++;
      auto p = dgtest::make_problem(ps);
      p->run_reference();
      SCOPED_TRACE(describe(ps.spec) + " " + to_string(kv));
      check_all(*p, {512});
    }
}

// The scales are read from memory when the kernels run: the same arguments launched again after
// new scales were written give the new reference (what a graph replay does; the executor tests
// check the replay itself). The launch before shows the old scales were in effect.
TEST(GpuKernels, Fp8ScalesReadAtRunTime) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (KVCacheDType kv : kFp8Kinds)
    for (KVLayout layout : kLayouts) {
      ProblemSpec ps;
      ps.spec = fp8_spec(kv, DType::kBFloat16, 64, 16, layout, 8, 2, i % 2 == 1);
      ps.lens = {5, 130};
      ps.seed = 3300 + i++;
      auto p = dgtest::make_problem(ps);
      DeviceProblem dp(*p);
      const Tolerance t = gpu_tol(ps.spec.dtype);
      for (int round = 0; round < 2; ++round) {
        if (round == 1) {
          for (float& k : p->k_scales) k *= 3.0f;
          for (float& v : p->v_scales) v *= 0.5f;
          const std::vector<unsigned char> before = dp.out_bytes();
          dp.upload_scales();  // same device addresses, new values
          p->run_reference();
          dp.run_v2(64);
          EXPECT_NE(before, dp.out_bytes()) << "new scales did not change the output";
        }
        p->run_reference();
        dp.run_v1();
        EXPECT_TRUE(p->check(t)) << "V1, scales round " << round;
        dp.run_v2(64);
        EXPECT_TRUE(p->check(t)) << "V2, scales round " << round;
      }
    }
}

// The quantising append: device and host write the same codes (one function, numeric.hpp), at the
// layout offsets spelled out here, each the code of x / scale (checked against the independent
// decode: the nearest finite value, ties to even, saturated), for NaN, +-inf, saturating and
// subnormal inputs and per-head scales.
TEST(GpuKernels, Fp8AppendMatchesHostAppend) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (KVCacheDType kv : kFp8Kinds)
    for (DType dt : {DType::kBFloat16, DType::kFloat16})
      for (KVLayout layout : kLayouts) {
        const int D = i % 2 ? 80 : 128, bs = i % 3 == 0 ? 8 : 16;
        const AttentionSpec s = fp8_spec(kv, dt, D, bs, layout, 8, 4, i % 2 == 0);
        const int num_blocks = 7, num_tokens = 11;
        std::mt19937_64 rng(4000 + i++);
        const std::size_t cn = static_cast<std::size_t>(num_blocks) * s.block_elems();
        const std::size_t tn = static_cast<std::size_t>(num_tokens) * s.num_kv_heads * D;
        dgtest::Buffer kc(cn), vc(cn);
        auto key = dgtest::make_buffer(dt, tn), value = dgtest::make_buffer(dt, tn);
        for (std::size_t e = 0; e < cn; ++e) static_cast<uint8_t*>(kc.data())[e] = static_cast<uint8_t>(rng() % 0x7e);
        std::memcpy(vc.data(), kc.data(), cn);
        const float big = kv == KVCacheDType::kFp8E4M3 ? 2000.f : 1e6f;
        dgtest::fill_uniform(dt, key.data(), tn, rng, -big, big);
        dgtest::fill_uniform(dt, value.data(), tn, rng, -1.f, 1.f);
        store_from_float(dt, key.data(), 3, NAN);
        store_from_float(dt, key.data(), 4, INFINITY);
        store_from_float(dt, key.data(), 5, -INFINITY);
        store_from_float(dt, value.data(), 6, 1e-7f);  // a subnormal code (or zero) after scaling
        std::vector<float> ks(s.kv_scale_count()), vs(s.kv_scale_count());
        for (std::size_t h = 0; h < ks.size(); ++h) {
          ks[h] = 0.5f + 0.25f * h;
          vs[h] = 1.0f / (256 + 64 * h);
        }
        std::vector<int64_t> slots(num_blocks * bs);
        for (std::size_t j = 0; j < slots.size(); ++j) slots[j] = static_cast<int64_t>(j);
        std::shuffle(slots.begin(), slots.end(), rng);
        slots.resize(num_tokens);
        slots[2] = -1;

        DevBuf dk(cn), dv(cn), dkey(key.bytes), dval(value.bytes), dslots(slots.size() * 8), dks(ks.size() * 4),
            dvs(vs.size() * 4);
        dk.upload(kc.data(), cn);
        dv.upload(vc.data(), cn);
        dkey.upload(key.data(), key.bytes);
        dval.upload(value.data(), value.bytes);
        dslots.upload(slots.data(), slots.size() * 8);
        dks.upload(ks.data(), ks.size() * 4);
        dvs.upload(vs.data(), vs.size() * 4);

        AppendArgs a;
        a.spec = s;
        a.num_tokens = num_tokens;
        a.num_blocks = num_blocks;
        a.key = key.data();
        a.value = value.data();
        a.k_cache = kc.data();
        a.v_cache = vc.data();
        a.slot_mapping = slots.data();
        a.k_scale = ks.data();
        a.v_scale = vs.data();
        host::append_kv(a);

        AppendArgs d = a;
        d.key = dkey.ptr;
        d.value = dval.ptr;
        d.k_cache = dk.ptr;
        d.v_cache = dv.ptr;
        d.slot_mapping = static_cast<const int64_t*>(dslots.ptr);
        d.k_scale = static_cast<const float*>(dks.ptr);
        d.v_scale = static_cast<const float*>(dvs.ptr);
        append_kv(d, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        dgtest::Buffer gk(cn), gv(cn);
        dk.download(gk.data(), cn);
        dv.download(gv.data(), cn);
        const std::string what = describe(s) + " " + to_string(kv);
        EXPECT_EQ(0, std::memcmp(gk.data(), kc.data(), cn)) << "K cache differs: " << what;
        EXPECT_EQ(0, std::memcmp(gv.data(), vc.data(), cn)) << "V cache differs: " << what;
        const int64_t H = s.num_kv_heads, B = s.block_size, x = 16;
        const double max = kv == KVCacheDType::kFp8E4M3 ? 448.0 : 57344.0;
        int wrong = 0;
        for (int tok = 0; tok < num_tokens; ++tok) {
          if (slots[tok] < 0) continue;
          const int64_t blk = slots[tok] / B, off = slots[tok] % B;
          for (int64_t h = 0; h < H; ++h)
            for (int64_t e = 0; e < D; ++e) {
              const std::size_t src = (static_cast<std::size_t>(tok) * H + h) * D + e;
              const int64_t ko = layout == KVLayout::kNHD ? ((blk * B + off) * H + h) * D + e
                                                          : (((blk * H + h) * (D / x) + e / x) * B + off) * x + e % x;
              const int64_t vo = layout == KVLayout::kNHD ? ko : ((blk * H + h) * D + e) * B + off;
              const int si = s.kv_scale_per_head ? static_cast<int>(h) : 0;
              for (int kind = 0; kind < 2; ++kind) {
                const float xin = load_as_float(dt, kind ? value.data() : key.data(), src) / (kind ? vs : ks)[si];
                const uint8_t code = static_cast<const uint8_t*>(kind ? gv.data() : gk.data())[kind ? vo : ko];
                const double got = dgtest::fp8_value(kv, code);
                if (std::isnan(xin)) {
                  wrong += code != 0x7f;
                  continue;
                }
                const double want = std::clamp(static_cast<double>(xin), -max, max);
                // No finite code lies nearer to the (saturated) input than the one stored.
                const uint8_t up = static_cast<uint8_t>((code & 0x7f) + 1), down = static_cast<uint8_t>((code & 0x7f) - 1);
                const double mag = std::fabs(want), here = std::fabs(mag - std::fabs(got));
                const bool sign_ok = got == 0 || (got < 0) == (want < 0);
                bool nearest = std::isfinite(got) && sign_ok;
                for (uint8_t nb : {up, down}) {
                  const double v = dgtest::fp8_value(kv, nb);
                  if ((code & 0x7f) == 0 && nb == down) continue;
                  if (std::isfinite(v) && std::fabs(mag - v) < here) nearest = false;
                  if (std::isfinite(v) && std::fabs(mag - v) == here && (code & 1)) nearest = false;  // tie: even
                }
                wrong += !nearest;
              }
            }
        }
        EXPECT_EQ(wrong, 0) << "codes not the nearest (ties even, saturated) at their offsets: " << what;
      }
}

/// host::append_kv of `slots` (negative: skipped) into k / v, the caches a device append must leave;
/// returns its arguments for the device call to start from.
AppendArgs host_append_into(const AttentionSpec& s, int num_tokens, int num_blocks, const dgtest::Buffer& key,
                            const dgtest::Buffer& value, const std::vector<int64_t>& slots, dgtest::Buffer& k,
                            dgtest::Buffer& v) {
  AppendArgs h;
  h.spec = s;
  h.num_tokens = num_tokens;
  h.num_blocks = num_blocks;
  h.key = key.data();
  h.value = value.data();
  h.k_cache = k.data();
  h.v_cache = v.data();
  h.slot_mapping = slots.data();
  host::append_kv(h);
  return h;
}

// With the sequences' lengths and block tables (what the executor passes), the append checks each
// slot against the slot of position seq_len - 1: the off-by-one slot (position seq_len), lengths
// that do not count the new token, and a slot past the cache are each skipped (nothing else in the
// cache changes) and reported in bad_slot as -(2 * token + kind), a bad block id at the position as
// the attention reports it ((token * stride + column) + 1); correct tokens are written.
TEST(GpuKernels, AppendKvSkipsAndReportsSlotsNotAtTheirPosition) {
  DG_REQUIRE_GPU();
  for (KVLayout layout : kLayouts) {
    const AttentionSpec s = make_spec(DType::kBFloat16, 128, 16, layout, 8, 2);
    const int bs = s.block_size, stride = 3, num_tokens = 5, num_blocks = num_tokens * stride + 1;
    const int64_t num_slots = static_cast<int64_t>(num_blocks) * bs;
    std::mt19937_64 rng(1300 + static_cast<int>(layout));
    const std::size_t cn = static_cast<std::size_t>(num_blocks) * s.block_elems();
    const std::size_t tn = static_cast<std::size_t>(num_tokens) * s.num_kv_heads * s.head_size;
    auto kc = dgtest::make_buffer(s.dtype, cn), vc = dgtest::make_buffer(s.dtype, cn);
    auto key = dgtest::make_buffer(s.dtype, tn), value = dgtest::make_buffer(s.dtype, tn);
    dgtest::fill_uniform(s.dtype, kc.data(), cn, rng);
    dgtest::fill_uniform(s.dtype, vc.data(), cn, rng);
    dgtest::fill_uniform(s.dtype, key.data(), tn, rng, -3.f, 3.f);
    dgtest::fill_uniform(s.dtype, value.data(), tn, rng, -3.f, 3.f);
    // Sequence i owns blocks [stride * i, stride * i + stride), in reverse order within its row.
    const std::vector<int32_t> good_lens = {17, 1, 33, 16, 48};
    std::vector<int32_t> tables(num_tokens * stride);
    for (int i = 0; i < num_tokens; ++i)
      for (int j = 0; j < stride; ++j) tables[i * stride + j] = stride * i + (stride - 1 - j);
    auto slot_of = [&](int i, int pos) { return static_cast<int64_t>(tables[i * stride + pos / bs]) * bs + pos % bs; };
    std::vector<int64_t> good_slots(num_tokens);
    for (int i = 0; i < num_tokens; ++i) good_slots[i] = slot_of(i, good_lens[i] - 1);

    struct Case {
      const char* what;
      int token;
      int report;  // expected flag (0: none)
    };
    const Case cases[] = {
        {"clean", -1, 0},
        {"slot of position seq_len (off by one)", 1, -(2 * 1 + 1)},
        {"seq_lens not counting the new token", 2, -(2 * 2 + 1)},
        {"slot past the cache", 3, -(2 * 3 + 2)},
        {"a length whose position is past the row", 4, -(2 * 4 + 1)},
        {"a bad block id at the position: reported as the attention would", 0, 0 * stride + 1 + 1},
    };
    DevBuf dk(kc.bytes), dv(vc.bytes), dkey(key.bytes), dval(value.bytes), dslots(num_tokens * 8),
        dlens(num_tokens * 4), dtables(tables.size() * 4), flag(sizeof(int));
    dkey.upload(key.data(), key.bytes);
    dval.upload(value.data(), value.bytes);
    for (const Case& c : cases) {
      SCOPED_TRACE(describe(s) + ": " + c.what);
      std::vector<int32_t> lens = good_lens;
      std::vector<int64_t> slots = good_slots;
      std::vector<int32_t> bad_tables = tables;
      if (c.token == 0) bad_tables[0 * stride + 1] = num_blocks + 3;  // sequence 0 has 17 tokens: column 1
      dtables.upload(bad_tables.data(), bad_tables.size() * 4);
      if (c.token == 1) slots[1] = slot_of(1, lens[1]);  // position seq_len
      if (c.token == 2) lens[2] -= 1;                    // the new token not counted
      if (c.token == 3) slots[3] = num_slots + 2;
      if (c.token == 4) lens[4] = stride * bs + 1;       // column 3 of a 3-entry row
      // Expected caches: the host append of every token but the wrong one.
      std::vector<int64_t> expect_slots = slots;
      if (c.token >= 0) expect_slots[c.token] = -1;
      dgtest::Buffer ek = kc, ev = vc;
      const AppendArgs h = host_append_into(s, num_tokens, num_blocks, key, value, expect_slots, ek, ev);

      dk.upload(kc.data(), kc.bytes);
      dv.upload(vc.data(), vc.bytes);
      dslots.upload(slots.data(), num_tokens * 8);
      dlens.upload(lens.data(), num_tokens * 4);
      const int zero = 0;
      flag.upload(&zero, sizeof zero);
      AppendArgs d = h;
      d.key = dkey.ptr;
      d.value = dval.ptr;
      d.k_cache = dk.ptr;
      d.v_cache = dv.ptr;
      d.slot_mapping = static_cast<const int64_t*>(dslots.ptr);
      d.seq_lens = static_cast<const int32_t*>(dlens.ptr);
      d.block_tables = static_cast<const int32_t*>(dtables.ptr);
      d.block_table_stride = stride;
      d.bad_slot = static_cast<int*>(flag.ptr);
      append_kv(d, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      int seen = 1;
      flag.download(&seen, sizeof seen);
      EXPECT_EQ(seen, c.report);
      auto gk = dgtest::make_buffer(s.dtype, cn), gv = dgtest::make_buffer(s.dtype, cn);
      dk.download(gk.data(), gk.bytes);
      dv.download(gv.data(), gv.bytes);
      EXPECT_EQ(0, std::memcmp(gk.data(), ek.data(), ek.bytes)) << "K cache: a wrong slot was written, or a good one not";
      EXPECT_EQ(0, std::memcmp(gv.data(), ev.data(), ev.bytes)) << "V cache: a wrong slot was written, or a good one not";
    }
    // Without a flag the device could only skip silently: refused before the launch.
    AppendArgs d;
    d.spec = s;
    d.num_tokens = num_tokens;
    d.num_blocks = num_blocks;
    d.key = dkey.ptr;
    d.value = dval.ptr;
    d.k_cache = dk.ptr;
    d.v_cache = dv.ptr;
    d.slot_mapping = static_cast<const int64_t*>(dslots.ptr);
    d.seq_lens = static_cast<const int32_t*>(dlens.ptr);
    d.block_tables = static_cast<const int32_t*>(dtables.ptr);
    d.block_table_stride = stride;
    dgtest::expect_error([&] { append_kv(d, nullptr); }, {"bad_slot = null", "block_tables"});
  }
}

// tokens_per_seq = 4 (a q_len 4 step: slot_mapping [num_seqs, 4], one length and table row per
// sequence): token j of sequence i is checked against position seq_lens[i] - 4 + j. A draft
// token's slot one position late, another sequence's slot, lengths not counting the step's tokens
// and a slot past the cache are skipped and reported as -(2 * token + kind) with the token's flat
// index; a bad block id at a position as the attention reports it, in the sequence's row
// ((sequence * stride + column) + 1). A padded sequence (length 0, slots -1, a junk table row) and a
// rejected draft (slot -1) are never read. Everything else matches the host append bit for bit.
TEST(GpuKernels, AppendKvChecksEachTokenOfASequencesGroupAgainstItsPosition) {
  DG_REQUIRE_GPU();
  for (KVLayout layout : kLayouts) {
    const AttentionSpec s = make_spec(DType::kFloat16, 96, 16, layout, 6, 3);
    const int n = 4, bs = s.block_size, stride = 4, num_seqs = 5, num_tokens = num_seqs * n;
    const int num_blocks = num_seqs * stride + 2;
    const int64_t num_slots = static_cast<int64_t>(num_blocks) * bs;
    std::mt19937_64 rng(1400 + static_cast<int>(layout));
    const std::size_t cn = static_cast<std::size_t>(num_blocks) * s.block_elems();
    const std::size_t tn = static_cast<std::size_t>(num_tokens) * s.num_kv_heads * s.head_size;
    auto kc = dgtest::make_buffer(s.dtype, cn), vc = dgtest::make_buffer(s.dtype, cn);
    auto key = dgtest::make_buffer(s.dtype, tn), value = dgtest::make_buffer(s.dtype, tn);
    dgtest::fill_uniform(s.dtype, kc.data(), cn, rng);
    dgtest::fill_uniform(s.dtype, vc.data(), cn, rng);
    dgtest::fill_uniform(s.dtype, key.data(), tn, rng, -3.f, 3.f);
    dgtest::fill_uniform(s.dtype, value.data(), tn, rng, -3.f, 3.f);
    // Shuffled distinct blocks; sequence 1's tokens straddle a block edge (positions 15..18).
    std::vector<int32_t> ids(num_blocks);
    for (int b = 0; b < num_blocks; ++b) ids[b] = b;
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> tables(ids.begin(), ids.begin() + num_seqs * stride);
    for (int j = 0; j < stride; ++j) tables[4 * stride + j] = j % 2 ? -3 : num_blocks + 7;  // padded: junk
    const std::vector<int32_t> good_lens = {4, 19, 50, 64, 0};
    auto slot_of = [&](int i, int pos) { return static_cast<int64_t>(tables[i * stride + pos / bs]) * bs + pos % bs; };
    std::vector<int64_t> good_slots(num_tokens, -1);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < n; ++j) good_slots[i * n + j] = slot_of(i, good_lens[i] - n + j);
    good_slots[2 * n + 3] = -1;  // a rejected draft of sequence 2

    struct Case {
      const char* what;
      std::vector<int> skipped;  // tokens the append must skip
      std::vector<int> reports;  // any of these flag values (one token's report wins)
    };
    const Case cases[] = {
        {"clean", {}, {0}},
        {"draft token 2 of sequence 1 one position late", {1 * n + 2}, {-(2 * (1 * n + 2) + 1)}},
        {"token 1 of sequence 3 at sequence 0's slot", {3 * n + 1}, {-(2 * (3 * n + 1) + 1)}},
        {"sequence 3's length not counting the step's 4 tokens",
         {12, 13, 14, 15},
         {-(2 * 12 + 1), -(2 * 13 + 1), -(2 * 14 + 1), -(2 * 15 + 1)}},
        {"token 3 of sequence 0 past the cache", {3}, {-(2 * 3 + 2)}},
        {"a bad block id under tokens 1..3 of sequence 1", {5, 6, 7}, {1 * stride + 1 + 1}},
    };
    DevBuf dk(kc.bytes), dv(vc.bytes), dkey(key.bytes), dval(value.bytes), dslots(num_tokens * 8),
        dlens(num_seqs * 4), dtables(tables.size() * 4), flag(sizeof(int));
    dkey.upload(key.data(), key.bytes);
    dval.upload(value.data(), value.bytes);
    for (std::size_t ci = 0; ci < std::size(cases); ++ci) {
      const Case& c = cases[ci];
      SCOPED_TRACE(describe(s) + ": " + c.what);
      std::vector<int32_t> lens = good_lens;
      std::vector<int64_t> slots = good_slots;
      std::vector<int32_t> bad_tables = tables;
      if (ci == 1) slots[1 * n + 2] = slot_of(1, 19 - n + 2 + 1);
      if (ci == 2) slots[3 * n + 1] = slot_of(0, 1);
      if (ci == 3) lens[3] -= n;
      if (ci == 4) slots[3] = num_slots + 5;
      if (ci == 5) bad_tables[1 * stride + 1] = num_blocks;
      dtables.upload(bad_tables.data(), bad_tables.size() * 4);
      // Expected caches: the host append of every token but the skipped ones.
      std::vector<int64_t> expect_slots = slots;
      for (int t : c.skipped) expect_slots[t] = -1;
      dgtest::Buffer ek = kc, ev = vc;
      const AppendArgs h = host_append_into(s, num_tokens, num_blocks, key, value, expect_slots, ek, ev);

      dk.upload(kc.data(), kc.bytes);
      dv.upload(vc.data(), vc.bytes);
      dslots.upload(slots.data(), num_tokens * 8);
      dlens.upload(lens.data(), num_seqs * 4);
      const int zero = 0;
      flag.upload(&zero, sizeof zero);
      AppendArgs d = h;
      d.key = dkey.ptr;
      d.value = dval.ptr;
      d.k_cache = dk.ptr;
      d.v_cache = dv.ptr;
      d.slot_mapping = static_cast<const int64_t*>(dslots.ptr);
      d.seq_lens = static_cast<const int32_t*>(dlens.ptr);
      d.block_tables = static_cast<const int32_t*>(dtables.ptr);
      d.block_table_stride = stride;
      d.tokens_per_seq = n;
      d.bad_slot = static_cast<int*>(flag.ptr);
      append_kv(d, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      int seen = 1;
      flag.download(&seen, sizeof seen);
      EXPECT_NE(std::find(c.reports.begin(), c.reports.end(), seen), c.reports.end()) << "flag " << seen;
      auto gk = dgtest::make_buffer(s.dtype, cn), gv = dgtest::make_buffer(s.dtype, cn);
      dk.download(gk.data(), gk.bytes);
      dv.download(gv.data(), gv.bytes);
      EXPECT_EQ(0, std::memcmp(gk.data(), ek.data(), ek.bytes)) << "K cache: a wrong slot was written, or a good one not";
      EXPECT_EQ(0, std::memcmp(gv.data(), ev.data(), ev.bytes)) << "V cache: a wrong slot was written, or a good one not";
    }
    // num_tokens must be whole groups of tokens_per_seq; tokens_per_seq within 1..kMaxQLen.
    AppendArgs d;
    d.spec = s;
    d.num_tokens = num_tokens - 1;
    d.num_blocks = num_blocks;
    d.key = dkey.ptr;
    d.value = dval.ptr;
    d.k_cache = dk.ptr;
    d.v_cache = dv.ptr;
    d.slot_mapping = static_cast<const int64_t*>(dslots.ptr);
    d.seq_lens = static_cast<const int32_t*>(dlens.ptr);
    d.block_tables = static_cast<const int32_t*>(dtables.ptr);
    d.block_table_stride = stride;
    d.tokens_per_seq = n;
    d.bad_slot = static_cast<int*>(flag.ptr);
    dgtest::expect_error([&] { append_kv(d, nullptr); }, {"num_tokens = 19", "a multiple of tokens_per_seq = 4"});
    d.num_tokens = num_tokens;
    d.tokens_per_seq = kMaxQLen + 1;
    dgtest::expect_error([&] { append_kv(d, nullptr); }, {"tokens_per_seq = 17", "1 .. kMaxQLen"});
  }
}

// ---------------------------------------------------------------- errors and the fault seam

TEST(GpuKernels, LaunchFaultSeamAndWorkspaceCheck) {
  DG_REQUIRE_GPU();
  ProblemSpec ps;
  ps.spec = make_spec(DType::kFloat16, 128, 16, KVLayout::kVLLM, 8, 2);
  ps.lens = {300, 1200};
  ps.seed = 13;
  auto p = dgtest::make_problem(ps);
  p->run_reference();
  DeviceProblem dp(*p);
  {
    fault::ScopedFault f(fault::Site::kKernelLaunch);
    try {
      paged_attention_v1(dp.args, nullptr);
      ADD_FAILURE() << "injected launch fault not reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("PagedDecodeKernel (V1)"), std::string::npos) << e.what();
    }
  }
  {
    const std::size_t bytes = v2_workspace_size(dp.args.spec, 2, dp.args.max_seq_len, 512);
    DevBuf ws(bytes);
    fault::ScopedFault f(fault::Site::kKernelLaunch, /*skip=*/1);  // pass 1 runs, the merge fails
    try {
      paged_attention_v2(dp.args, 512, ws.ptr, ws.bytes, nullptr);
      ADD_FAILURE() << "injected merge launch fault not reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MergePartitionsKernel"), std::string::npos) << e.what();
    }
    EXPECT_THROW(paged_attention_v2(dp.args, 512, ws.ptr, bytes - 4, nullptr), Error);
  }
  CUDA_OK(cudaDeviceSynchronize());
  dp.run_v2(512);  // unarmed again: a normal run works and is right
  EXPECT_TRUE(p->check(gpu_tol(DType::kFloat16)));
}

// ---------------------------------------------------------------- strides, padded rows, bad ids

// A fused QKV buffer [batch, (hq + 2 hk) x d] feeds the append (key/value strides) and the attention
// (q stride) in place; out rows are written out_stride apart. The caches must equal the host
// append's, the gaps between output rows and the padded row must stay untouched, and V1, V2 and
// the naive kernel must match the reference (which reads q through the stride itself).
TEST(GpuKernels, FusedQkvBufferThroughRowStrides) {
  DG_REQUIRE_GPU();
  int i = 0;
  for (DType dt : kDTypes) {
    for (KVLayout layout : kLayouts) {
      ProblemSpec ps;
      ps.spec = make_spec(dt, i % 2 ? 128 : 80, i % 3 == 0 ? 8 : 16, layout, 8, 2);
      ps.lens = {37, 0, 1, 300, 16, 17, 90};
      ps.distinct_blocks = true;
      ps.seed = 800 + i++;
      auto p = dgtest::make_problem(ps);
      const AttentionSpec& s = ps.spec;
      SCOPED_TRACE(describe(s));
      const int n = static_cast<int>(ps.lens.size()), d = s.head_size, hq = s.num_q_heads, hk = s.num_kv_heads;
      const std::size_t es = dtype_size(dt);
      const int64_t row = static_cast<int64_t>(hq + 2 * hk) * d;
      auto fused = dgtest::make_buffer(dt, static_cast<std::size_t>(n) * row);
      std::mt19937_64 rng(ps.seed);
      dgtest::fill_uniform(dt, fused.data(), static_cast<std::size_t>(n) * row, rng);
      std::vector<int64_t> slots;
      for (int sq = 0; sq < n; ++sq) {
        const int len = ps.lens[sq];
        const int32_t blk = len == 0 ? 0 : p->tables[sq * p->args.block_table_stride + (len - 1) / s.block_size];
        slots.push_back(len == 0 ? -1 : static_cast<int64_t>(blk) * s.block_size + (len - 1) % s.block_size);
      }
      DeviceProblem dp(*p);  // caches before the append
      DevBuf dfused(fused.bytes), dslots(slots.size() * sizeof(int64_t));
      dfused.upload(fused.data(), fused.bytes);
      dslots.upload(slots.data(), slots.size() * sizeof(int64_t));

      // Host: append from the fused buffer, then the reference on the appended caches.
      AppendArgs ha;
      ha.spec = s;
      ha.num_tokens = n;
      ha.num_blocks = p->args.num_blocks;
      ha.key = static_cast<const char*>(fused.data()) + int64_t{hq} * d * es;
      ha.value = static_cast<const char*>(fused.data()) + int64_t{hq + hk} * d * es;
      ha.key_stride = row;
      ha.value_stride = row;
      ha.k_cache = p->k.data();
      ha.v_cache = p->v.data();
      ha.slot_mapping = slots.data();
      host::append_kv(ha);
      DecodeArgs ra = p->args;
      ra.q = fused.data();
      ra.q_stride = row;
      p->ref.assign(p->out_elems, std::nan(""));
      reference::paged_attention(ra, p->ref.data());

      // Device: the same append, then the attention straight from the fused buffer.
      AppendArgs da = ha;
      da.key = static_cast<const char*>(dfused.ptr) + int64_t{hq} * d * es;
      da.value = static_cast<const char*>(dfused.ptr) + int64_t{hq + hk} * d * es;
      da.k_cache = dp.k->ptr;
      da.v_cache = dp.v->ptr;
      da.slot_mapping = static_cast<const int64_t*>(dslots.ptr);
      da.host_slot_mapping = slots.data();
      append_kv(da, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      auto gk = dgtest::make_buffer(dt, p->k.bytes / es), gv = dgtest::make_buffer(dt, p->v.bytes / es);
      dp.k->download(gk.data(), gk.bytes);
      dp.v->download(gv.data(), gv.bytes);
      EXPECT_EQ(std::memcmp(gk.data(), p->k.data(), p->k.bytes), 0) << "strided append: K cache differs";
      EXPECT_EQ(std::memcmp(gv.data(), p->v.data(), p->v.bytes), 0) << "strided append: V cache differs";

      const int64_t out_stride = int64_t{hq} * d + 24;  // a 16-byte multiple of gap for every dtype
      const std::size_t wide_elems = static_cast<std::size_t>(n) * out_stride;
      auto poison = dgtest::make_buffer(dt, wide_elems), got = dgtest::make_buffer(dt, wide_elems);
      dgtest::poison(dt, poison.data(), wide_elems);
      DevBuf dout(poison.bytes);
      DecodeArgs a = dp.args;
      a.q = dfused.ptr;
      a.q_stride = row;
      a.out = dout.ptr;
      a.out_stride = out_stride;
      const std::size_t wb = v2_workspace_size(s, n, a.max_seq_len, 2 * s.block_size);
      DevBuf ws(wb);
      for (int kernel = 0; kernel < 3; ++kernel) {
        const char* name = kernel == 0 ? "V1" : kernel == 1 ? "V2" : "naive";
        dout.upload(poison.data(), poison.bytes);
        if (kernel == 0) paged_attention_v1(a, nullptr);
        if (kernel == 1) paged_attention_v2(a, 2 * s.block_size, ws.ptr, wb, nullptr);
        if (kernel == 2) naive::paged_attention_v1(a, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        dout.download(got.data(), got.bytes);
        auto packed = dgtest::make_buffer(dt, p->out_elems);
        for (int r = 0; r < n; ++r) {
          const char* grow = static_cast<const char*>(got.data()) + r * out_stride * es;
          const char* prow = static_cast<const char*>(poison.data()) + r * out_stride * es;
          EXPECT_EQ(std::memcmp(grow + int64_t{hq} * d * es, prow + int64_t{hq} * d * es, 24 * es), 0)
              << name << " wrote into the gap after row " << r;
          if (ps.lens[r] == 0) EXPECT_EQ(std::memcmp(grow, prow, int64_t{hq} * d * es), 0) << name << " padded row";
          std::memcpy(static_cast<char*>(packed.data()) + r * int64_t{hq} * d * es, grow, int64_t{hq} * d * es);
        }
        EXPECT_TRUE(dgtest::check_close(dt, packed.data(), p->ref.data(), n, hq, d, gpu_tol(dt).atol,
                                        gpu_tol(dt).rtol, p->mask))
            << name;
      }
    }
  }
}

// The case reported in issue 11 (NHD fp32, 8q/2kv, head 64, seq_lens {0, 40}) with host lengths
// given: accepted, the padded row left untouched, the live one right.
TEST(GpuKernels, PaddedRowAcceptedWithHostLengths) {
  DG_REQUIRE_GPU();
  ProblemSpec ps;
  ps.spec = make_spec(DType::kFloat32, 64, 16, KVLayout::kNHD, 8, 2);
  ps.lens = {0, 40};
  ps.seed = 1100;
  auto p = dgtest::make_problem(ps);
  p->run_reference();
  DeviceProblem dp(*p);
  ASSERT_EQ(dp.args.host_seq_lens, p->lens.data());
  dp.args.host_block_tables = p->tables.data();  // entries a length uses are valid; row 0 uses none
  const Tolerance t = gpu_tol(DType::kFloat32);
  dp.run_v1();
  EXPECT_TRUE(p->check(t)) << "V1";
  EXPECT_TRUE(p->padded_rows_untouched()) << "V1";
  dp.run_v2(16);
  EXPECT_TRUE(p->check(t)) << "V2";
  EXPECT_TRUE(p->padded_rows_untouched()) << "V2";
  dp.run_naive();
  EXPECT_TRUE(p->check(t)) << "naive";
  EXPECT_TRUE(p->padded_rows_untouched()) << "naive";
}

// A block id outside [0, num_blocks) in a used table entry (cheap validation: no host copy of the
// table) must not read outside the cache (the simulator's bounds checks abort on that) and must
// be reported through bad_block as (seq * stride + index) + 1. Rows without a bad id stay right.
TEST(GpuKernels, BadBlockIdsAreClampedAndReported) {
  DG_REQUIRE_GPU();
  for (KVLayout layout : kLayouts) {
    ProblemSpec ps;
    ps.spec = make_spec(DType::kBFloat16, 128, 16, layout, 8, 2);
    ps.lens = {50, 20, 70};
    ps.distinct_blocks = true;
    ps.seed = 1200 + static_cast<int>(layout);
    auto p = dgtest::make_problem(ps);
    p->run_reference();
    DeviceProblem dp(*p);
    DevBuf flag(sizeof(int));
    dp.args.bad_block = static_cast<int*>(flag.ptr);
    const int stride = dp.args.block_table_stride;
    struct Bad {
      int seq, index, id;
    };
    const Bad cases[] = {{0, 2, p->args.num_blocks + 5}, {2, 0, -3}, {2, 4, 1 << 30}};
    for (const Bad& b : cases) {
      SCOPED_TRACE(describe(ps.spec) + " block_tables[" + std::to_string(b.seq) + "][" + std::to_string(b.index) +
                   "] = " + std::to_string(b.id));
      std::vector<int32_t> tables = p->tables;
      tables[b.seq * stride + b.index] = b.id;
      dp.tables->upload(tables.data(), tables.size() * sizeof(int32_t));
      std::vector<bool> good(p->mask);
      good[b.seq] = false;  // this row used a clamped block: its values are not checked
      for (int kernel = 0; kernel < 3; ++kernel) {
        const char* name = kernel == 0 ? "V1" : kernel == 1 ? "V2" : "naive";
        const int zero = 0;
        flag.upload(&zero, sizeof zero);
        if (kernel == 0) dp.run_v1();
        if (kernel == 1) dp.run_v2(32);
        if (kernel == 2) dp.run_naive();
        int seen = 0;
        flag.download(&seen, sizeof seen);
        EXPECT_EQ(seen, b.seq * stride + b.index + 1) << name;
        EXPECT_TRUE(dgtest::check_close(ps.spec.dtype, p->out.data(), p->ref.data(), 3, 8, 128,
                                        gpu_tol(ps.spec.dtype).atol, gpu_tol(ps.spec.dtype).rtol, good))
            << name << ": rows without a bad id";
      }
    }
    // A clean table leaves the flag at 0.
    dp.tables->upload(p->tables.data(), p->tables.size() * sizeof(int32_t));
    const int zero = 0;
    flag.upload(&zero, sizeof zero);
    dp.run_v2(32);
    int seen = -1;
    flag.download(&seen, sizeof seen);
    EXPECT_EQ(seen, 0);
    EXPECT_TRUE(p->check(gpu_tol(ps.spec.dtype)));
  }
}

}  // namespace
