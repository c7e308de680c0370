// The simulator's tensor-core shims (ldmatrix, mma.sync.m16n8k16; tests/sim/shim) against a plain
// matrix multiply. The fragment layouts the shims implement are the PTX ISA's ("Matrix Fragments for
// mma.m16n8k16 with floating point type"; "ldmatrix": lane 8 m + r addresses row r of matrix m,
// and lane 4 r + w receives word w of row r); this file uses them the way CUDA kernels do (A by
// ldmatrix.x4 from a row-major tile, B by ldmatrix.x2 from [n][k] rows, or .x2.trans from [k][n]
// rows, and fragments built by hand), so a shim whose layout disagreed with itself or with the
// PTX ISA fails here. Plus what must fail: a lane skipping the collective, a partial warp, lanes
// at different collectives, and ldmatrix rows in one bank group.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "decodegraph/numeric.hpp"
#include "sim_device_ops.hpp"

#ifndef DECODEGRAPH_SIM
#error "tests/sim must compile against tests/sim/shim, not the CUDA toolkit headers"
#endif

namespace {

namespace dev = decodegraph::kernels::dev;

struct Operands {
  bool bf16;
  std::vector<uint16_t> a;  // 16 x 16, row-major
  std::vector<uint16_t> b;  // 16 x 8 ([k][n]), row-major
  std::vector<float> c;     // 16 x 8
};

uint16_t to_bits(bool bf16, float v) {
  return bf16 ? decodegraph::float_to_bf16_bits(v) : decodegraph::float_to_fp16_bits(v);
}
double from_bits(bool bf16, uint16_t h) {
  return bf16 ? decodegraph::bf16_bits_to_float(h) : decodegraph::fp16_bits_to_float(h);
}

Operands random_operands(bool bf16, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  Operands o{bf16, std::vector<uint16_t>(256), std::vector<uint16_t>(128), std::vector<float>(128)};
  for (auto& x : o.a) x = to_bits(bf16, u(rng));
  for (auto& x : o.b) x = to_bits(bf16, u(rng));
  for (auto& x : o.c) x = u(rng);
  return o;
}

/// D = A B + C in float64 from the rounded inputs, and the bound on an fp32 sum of those terms.
void expect_matches_plain_multiply(const Operands& o, const std::vector<float>& d, const char* what) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double ref = o.c[i * 8 + j], mag = std::fabs(ref);
      for (int k = 0; k < 16; ++k) {
        const double p = from_bits(o.bf16, o.a[i * 16 + k]) * from_bits(o.bf16, o.b[k * 8 + j]);
        ref += p;
        mag += std::fabs(p);
      }
      // Products of 16-bit floats are exact in fp32; 17 fp32 additions round at most 17 times.
      EXPECT_NEAR(d[i * 8 + j], ref, 17 * mag * 0x1p-24) << what << " (" << i << ", " << j << ")";
    }
}

uint32_t pack(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

template <bool kBf16>
void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16)
    dev::mma_m16n8k16<__nv_bfloat16>(d, a, b0, b1);
  else
    dev::mma_m16n8k16<__half>(d, a, b0, b1);
}

/// Stores this lane's D fragment (PTX: d[i] at row g + 8 (i / 2), column 2t + (i % 2)).
void store_d(std::vector<float>& out, const float (&d)[4], int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) out[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

/// Fragments built by hand from the PTX ISA's tables (no ldmatrix).
template <bool kBf16>
std::vector<float> run_registers(const Operands& o) {
  std::vector<float> out(128, NAN);
  sim::launch(
      [&] {
        const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
        auto A = [&](int r, int c) { return o.a[r * 16 + c]; };
        auto B = [&](int k, int n) { return o.b[k * 8 + n]; };
        const uint32_t a[4] = {pack(A(g, 2 * t), A(g, 2 * t + 1)), pack(A(g + 8, 2 * t), A(g + 8, 2 * t + 1)),
                               pack(A(g, 2 * t + 8), A(g, 2 * t + 9)), pack(A(g + 8, 2 * t + 8), A(g + 8, 2 * t + 9))};
        const uint32_t b0 = pack(B(2 * t, g), B(2 * t + 1, g)), b1 = pack(B(2 * t + 8, g), B(2 * t + 9, g));
        float d[4];
        for (int i = 0; i < 4; ++i) d[i] = o.c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
        mma<kBf16>(d, a, b0, b1);
        store_d(out, d, lane);
      },
      dim3(1), dim3(32), 0);
  return out;
}

/// A by ldmatrix.x4 from a row-major tile, B by ldmatrix.x2 (from B^T, [n][k]) or .x2.trans (from B,
/// [k][n]). Rows of A and B^T are padded to 24 elements (48 bytes), so each matrix's 8 rows fall in
/// 8 different bank groups.
template <bool kBf16, bool kTransB>
std::vector<float> run_ldmatrix(const Operands& o) {
  std::vector<float> out(128, NAN);
  sim::launch(
      [&] {
        __shared__ __align__(16) uint16_t s_a[16 * 24];
        __shared__ __align__(16) uint16_t s_bt[8 * 24];
        __shared__ __align__(16) uint16_t s_b[16 * 8];
        sim::register_shared(s_a, sizeof s_a);
        sim::register_shared(s_bt, sizeof s_bt);
        sim::register_shared(s_b, sizeof s_b);
        const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
        for (int i = lane; i < 256; i += 32) s_a[(i / 16) * 24 + i % 16] = o.a[i];
        for (int i = lane; i < 128; i += 32) {
          s_b[i] = o.b[i];
          s_bt[(i % 8) * 24 + i / 8] = o.b[i];  // B^T[n][k] = B[k][n]
        }
        __syncwarp();
        uint32_t a[4], b[2];
        const int m = lane / 8, r = lane % 8;
        // Matrices 0..3 = (rows 0-7 | 8-15) x (cols 0-7 | 8-15): registers a0..a3 in PTX order.
        dev::ldmatrix<4, false>(a, dev::smem_addr(&s_a[((m & 1) * 8 + r) * 24 + (m >> 1) * 8]));
        if constexpr (kTransB)
          dev::ldmatrix<2, true>(b, dev::smem_addr(&s_b[(lane % 16) * 8]));  // matrix m: k rows 8m..8m+7
        else
          dev::ldmatrix<2, false>(b, dev::smem_addr(&s_bt[r * 24 + (m % 2) * 8]));  // matrix m: k 8m..8m+7
        float d[4];
        for (int i = 0; i < 4; ++i) d[i] = o.c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
        mma<kBf16>(d, a, b[0], b[1]);
        store_d(out, d, lane);
      },
      dim3(1), dim3(32), 0);
  return out;
}

TEST(SimTensorCores, MmaFromRegistersMatchesPlainMultiply) {
  for (uint64_t seed : {1, 2, 3}) {
    const long before = sim::mma_count();
    expect_matches_plain_multiply(random_operands(true, seed), run_registers<true>(random_operands(true, seed)),
                                  "bf16");
    expect_matches_plain_multiply(random_operands(false, seed), run_registers<false>(random_operands(false, seed)),
                                  "fp16");
    EXPECT_EQ(sim::mma_count(), before + 2);  // one warp-level mma per launch
  }
}

TEST(SimTensorCores, LdmatrixFeedsMmaLikeThePlainMultiply) {
  for (uint64_t seed : {4, 5}) {
    const Operands bf = random_operands(true, seed), hf = random_operands(false, seed);
    expect_matches_plain_multiply(bf, run_ldmatrix<true, false>(bf), "bf16, B by ldmatrix.x2");
    expect_matches_plain_multiply(bf, run_ldmatrix<true, true>(bf), "bf16, B by ldmatrix.x2.trans");
    expect_matches_plain_multiply(hf, run_ldmatrix<false, false>(hf), "fp16, B by ldmatrix.x2");
    expect_matches_plain_multiply(hf, run_ldmatrix<false, true>(hf), "fp16, B by ldmatrix.x2.trans");
  }
}

// A wrong fragment element must show: swapping the two B registers changes the product.
TEST(SimTensorCores, SwappedFragmentRegistersAreWrong) {
  const Operands o = random_operands(true, 9);
  std::vector<float> out(128, NAN);
  sim::launch(
      [&] {
        const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
        auto A = [&](int r, int c) { return o.a[r * 16 + c]; };
        auto B = [&](int k, int n) { return o.b[k * 8 + n]; };
        const uint32_t a[4] = {pack(A(g, 2 * t), A(g, 2 * t + 1)), pack(A(g + 8, 2 * t), A(g + 8, 2 * t + 1)),
                               pack(A(g, 2 * t + 8), A(g, 2 * t + 9)), pack(A(g + 8, 2 * t + 8), A(g + 8, 2 * t + 9))};
        const uint32_t b0 = pack(B(2 * t, g), B(2 * t + 1, g)), b1 = pack(B(2 * t + 8, g), B(2 * t + 9, g));
        float d[4];
        for (int i = 0; i < 4; ++i) d[i] = o.c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
        mma<true>(d, a, b1, b0);
        store_d(out, d, lane);
      },
      dim3(1), dim3(32), 0);
  const std::vector<float> right = run_registers<true>(o);
  int differ = 0;
  for (int i = 0; i < 128; ++i) differ += out[i] != right[i];
  EXPECT_GT(differ, 100);
}

void mma_in_block(int threads, int skip_lane) {
  sim::launch(
      [&] {
        const uint32_t a[4] = {0, 0, 0, 0};
        float d[4] = {0, 0, 0, 0};
        if (static_cast<int>(threadIdx.x) != skip_lane) mma<false>(d, a, 0u, 0u);
      },
      dim3(1), dim3(threads), 0);
}

using SimTensorCoresDeathTest = ::testing::Test;

TEST(SimTensorCoresDeathTest, LaneMissingFromMmaFails) {
  EXPECT_DEATH(mma_in_block(32, 5), "SIM FAILURE: deadlock");
}

TEST(SimTensorCoresDeathTest, PartialWarpFails) { EXPECT_DEATH(mma_in_block(16, -1), "SIM FAILURE: warp op in a partial warp"); }

TEST(SimTensorCoresDeathTest, LanesAtDifferentCollectivesFail) {
  auto body = [] {
    sim::launch(
        [] {
          __shared__ __align__(16) uint16_t s[32 * 8];
          sim::register_shared(s, sizeof s);
          uint32_t r[4];
          const int lane = static_cast<int>(threadIdx.x);
          if (lane < 16)
            dev::ldmatrix<4, false>(r, dev::smem_addr(&s[lane * 8]));
          else
            dev::ldmatrix<2, false>(r, dev::smem_addr(&s[lane * 8]));
        },
        dim3(1), dim3(32), 0);
  };
  EXPECT_DEATH(body(), "SIM FAILURE: lanes of one warp meet different warp ops");
}

// Rows 32 bytes apart (an unpadded 16 x 16 tile): the 8 rows of a matrix hit 4 bank groups twice.
TEST(SimTensorCoresDeathTest, LdmatrixBankConflictIsReported) {
  auto body = [](int stride) {
    sim::launch(
        [stride] {
          __shared__ __align__(16) uint16_t s[16 * 24];
          sim::register_shared(s, sizeof s);
          const int lane = static_cast<int>(threadIdx.x), m = lane / 8, r = lane % 8;
          for (int i = lane; i < 16 * 24; i += 32) s[i] = 0;
          __syncthreads();
          uint32_t a[4];
          dev::ldmatrix<4, false>(a, dev::smem_addr(&s[((m & 1) * 8 + r) * stride + (m >> 1) * 8]));
          __syncthreads();  // the bank model judges a block's accesses at its barriers
        },
        dim3(1), dim3(32), 0);
  };
  body(24);  // padded rows: conflict-free, passes
  EXPECT_DEATH(body(16), "SIM FAILURE: shared-memory bank conflict");
}

}  // namespace
