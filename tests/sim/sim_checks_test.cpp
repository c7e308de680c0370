// The simulator's strictness checks (tests/sim/shim), each on a deliberately wrong toy kernel that
// must fail and on the right one that must pass, in both thread orders where order matters:
//   cp.async visibility  until a barrier, landed data is visible only to the issuing thread (PTX
//                        ISA, cp.async.wait_group), or to its warp after a __syncwarp; tracked
//                        reads (lds16, ldmatrix rows) of it fail, plain reads see NaN, plain
//                        stores into it fail; refilling bytes another thread read since the last
//                        barrier fails.
//   barriers             every thread at the same __syncthreads call site (bar.sync is .aligned);
//                        exited threads no longer hold a barrier back.
//   alignment            misaligned vector loads and stores (they fault on a GPU) fail.
//   cub::BlockReduce     reusing TempStorage without a barrier fails (the shim has no trailing one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "cub/block/block_reduce.cuh"
#include "sim_device_ops.hpp"
#include "sim_runtime.hpp"

#ifndef DECODEGRAPH_SIM
#error "tests/sim must compile against tests/sim/shim, not the CUDA toolkit headers"
#endif

namespace {

namespace dev = decodegraph::kernels::dev;

constexpr sim::Order kOrders[] = {sim::Order::kForward, sim::Order::kReverse};

void run(const std::function<void()>& body, int threads, sim::Order order) {
  sim::set_order(order);
  sim::launch(body, dim3(1), dim3(static_cast<unsigned>(threads)), 0);
  sim::set_order(sim::Order::kFromEnv);
}

// n random 16-byte chunks in device memory (finite floats, so NaN means "not seen").
struct Chunks {
  std::vector<uint4> host;
  uint4* dev = nullptr;
  explicit Chunks(int n, uint64_t seed = 7) : host(static_cast<size_t>(n)) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    for (uint4& c : host) {
      float f[4] = {u(rng), u(rng), u(rng), u(rng)};
      std::memcpy(&c, f, sizeof c);
    }
    EXPECT_EQ(cudaMalloc(&dev, host.size() * sizeof(uint4)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dev, host.data(), host.size() * sizeof(uint4), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Chunks() { cudaFree(dev); }
};

bool same(const uint4& a, const uint4& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A block of n <= 64 threads in which thread t first copies in.dev[t] into s[t] (a __shared__
// array of 64 chunks) by cp.async, runs before_wait(s, t), waits for the copy, then runs rest(s, t).
using ToyStep = std::function<void(uint4*, int)>;
void run_landed(const Chunks& in, int n, sim::Order order, const ToyStep& rest, const ToyStep& before_wait = {}) {
  run(
      [&] {
        __shared__ __align__(16) uint4 s[64];
        sim::register_shared(s, sizeof s);
        const int t = static_cast<int>(threadIdx.x);
        dev::cp_async_16(&s[t], &in.dev[t], 16, dev::evict_first_policy());
        dev::cp_async_commit();
        if (before_wait) before_wait(s, t);
        dev::cp_async_wait<0>();
        rest(s, t);
      },
      n, order);
}

// ---------------------------------------------------------------- cp.async visibility

// Every lane has landed its copy before any lane reads (the shuffle is a rendezvous, but it orders
// no memory), so what a wrong toy kernel trips on is the visibility rule, in either order.
void all_lanes_landed() { (void)__shfl_xor_sync(0xffffffffu, 0.0f, 1); }

// Thread t copies chunk t into s[t] and waits; then it reads its neighbour's s[t ^ 1] by lds16.
void neighbour_read(const Chunks& in, std::vector<uint4>& out, bool barrier, sim::Order order) {
  run_landed(in, 64, order, [&](uint4* s, int t) {
    all_lanes_landed();
    if (barrier) __syncthreads();
    out[static_cast<size_t>(t)] = dev::lds16(dev::smem_addr(&s[t ^ 1]));
  });
}

TEST(SimCpAsyncVisibility, OtherThreadsSeeLandedDataAfterABarrier) {
  const Chunks in(64);
  for (sim::Order order : kOrders) {
    std::vector<uint4> out(64);
    neighbour_read(in, out, /*barrier=*/true, order);
    for (int t = 0; t < 64; ++t) EXPECT_TRUE(same(out[t], in.host[t ^ 1])) << "thread " << t;
  }
}

TEST(SimCpAsyncVisibilityDeathTest, ReadingAnotherThreadsLandedDataBeforeABarrierFails) {
  const Chunks in(64);
  std::vector<uint4> out(64);
  for (sim::Order order : kOrders)
    EXPECT_DEATH(neighbour_read(in, out, /*barrier=*/false, order),
                 "SIM FAILURE: lds16 reads shared bytes that thread [0-9]+'s cp.async landed with no barrier");
}

TEST(SimCpAsyncVisibilityDeathTest, ReadingBeforeTheWaitFails) {
  const Chunks in(32);
  auto body = [&] {
    run_landed(
        in, 32, sim::Order::kForward, [](uint4*, int) {},
        [](uint4* s, int t) { (void)dev::lds16(dev::smem_addr(&s[t])); });  // its own copy, not yet waited for
  };
  EXPECT_DEATH(body(), "SIM FAILURE: lds16 reads shared bytes whose cp.async \\(issued by thread 0\\) has not landed");
}

// Plain C++ reads are not tracked, but a chunk another thread landed since the last barrier holds
// NaN bytes for them. Forward order: thread t - 1 has run (and landed) before thread t reads.
TEST(SimCpAsyncVisibility, PlainReadsOfUnpublishedDataSeeNaN) {
  const Chunks in(64);
  for (bool barrier : {false, true}) {
    std::vector<float> out(64, 0.0f);
    run_landed(in, 64, sim::Order::kForward, [&](uint4* s, int t) {
      if (barrier) __syncthreads();
      out[static_cast<size_t>(t)] = reinterpret_cast<const float*>(&s[(t + 63) % 64])[2];
      EXPECT_TRUE(same(s[t], in.host[t])) << "thread " << t;  // its own chunk it sees at once
    });
    for (int t = 0; t < 64; ++t) {
      float want[4];
      std::memcpy(want, &in.host[(t + 63) % 64], sizeof want);
      if (barrier)
        EXPECT_EQ(out[t], want[2]) << "thread " << t;
      else
        EXPECT_TRUE(std::isnan(out[t])) << "thread " << t << " saw " << out[t];
    }
  }
}

// Plain stores are not tracked either, but bytes a cp.async poisoned change only through a race:
// a store into a copy's destination before its wait, or into bytes another thread landed before a
// barrier published them, fails when the copy lands or when its writer next runs.
enum class PlainStore { kInFlight, kOtherThreadsLanded, kAfterBarrier };
void plain_store(const Chunks& in, std::vector<uint4>& out, PlainStore when, sim::Order order) {
  run_landed(
      in, 32, order,
      [&](uint4* s, int t) {
        all_lanes_landed();
        if (when == PlainStore::kOtherThreadsLanded) s[t ^ 1].y = 6u;
        __syncthreads();
        if (when == PlainStore::kAfterBarrier) s[t ^ 1].y = 6u;
        __syncthreads();
        out[static_cast<size_t>(t)] = s[t];
      },
      [&](uint4* s, int t) {
        if (when == PlainStore::kInFlight) s[t].x = 5u;  // its own copy, in flight
      });
}

TEST(SimCpAsyncVisibility, PlainStoreAfterTheBarrierPasses) {
  const Chunks in(32);
  for (sim::Order order : kOrders) {
    std::vector<uint4> out(32);
    plain_store(in, out, PlainStore::kAfterBarrier, order);
    for (int t = 0; t < 32; ++t) {
      uint4 want = in.host[t];
      want.y = 6u;
      EXPECT_TRUE(same(out[t], want)) << "thread " << t;
    }
  }
}

TEST(SimCpAsyncVisibilityDeathTest, PlainStoresThatRaceWithACopyFail) {
  const Chunks in(32);
  std::vector<uint4> out(32);
  for (sim::Order order : kOrders) {
    EXPECT_DEATH(plain_store(in, out, PlainStore::kInFlight, order),
                 "SIM FAILURE: a plain store into shared bytes while a cp.async \\(issued by .*\\) wrote them");
    EXPECT_DEATH(plain_store(in, out, PlainStore::kOtherThreadsLanded, order),
                 "SIM FAILURE: a plain store into shared bytes that thread [0-9]+'s cp.async landed");
  }
}

// A __syncwarp publishes what the warp's lanes landed to that warp, not to the other warps.
void warp_read(const Chunks& in, std::vector<uint4>& out, int partner_xor, sim::Order order) {
  run_landed(in, 64, order, [&](uint4* s, int t) {
    __syncwarp();
    all_lanes_landed();  // both warps have landed and synced before anyone reads
    out[static_cast<size_t>(t)] = dev::lds16(dev::smem_addr(&s[t ^ partner_xor]));
  });
}

TEST(SimCpAsyncVisibility, SyncwarpPublishesToTheWarp) {
  const Chunks in(64);
  for (sim::Order order : kOrders) {
    std::vector<uint4> out(64);
    warp_read(in, out, 1, order);
    for (int t = 0; t < 64; ++t) EXPECT_TRUE(same(out[t], in.host[t ^ 1])) << "thread " << t;
  }
}

TEST(SimCpAsyncVisibilityDeathTest, SyncwarpDoesNotPublishToOtherWarps) {
  const Chunks in(64);
  std::vector<uint4> out(64);
  for (sim::Order order : kOrders)
    EXPECT_DEATH(warp_read(in, out, 32, order),
                 "SIM FAILURE: lds16 reads shared bytes that thread [0-9]+'s cp.async landed with only a __syncwarp");
}

// ldmatrix: lane l's row address is read as lane l sees it. Each lane lands one 8-element row;
// `shift` = 0 addresses its own row (visible at once), 1 its neighbour's (needs the barrier).
void ldmatrix_rows(const Chunks& in, std::vector<uint32_t>& regs, int shift, bool barrier, sim::Order order) {
  run_landed(in, 32, order, [&](uint4* s, int l) {
    all_lanes_landed();
    if (barrier) __syncthreads();
    uint32_t r[4];  // consecutive 16-byte rows: one matrix's 8 rows in 8 bank groups
    dev::ldmatrix<4, false>(r, dev::smem_addr(&s[(l + shift) % 32]));
    for (int m = 0; m < 4; ++m) regs[static_cast<size_t>(4 * l + m)] = r[m];
  });
}

TEST(SimCpAsyncVisibility, LdmatrixRowsFollowTheSameRule) {
  const Chunks in(32);
  for (sim::Order order : kOrders)
    for (auto [shift, barrier] : {std::pair{0, false}, std::pair{1, true}}) {
      std::vector<uint32_t> regs(128);
      ldmatrix_rows(in, regs, shift, barrier, order);
      // PTX ldmatrix: register m of lane 4g + w is word w of row g of matrix m; matrix m's row g is
      // the row lane 8m + g addressed.
      for (int l = 0; l < 32; ++l)
        for (int m = 0; m < 4; ++m) {
          uint32_t words[4];
          std::memcpy(words, &in.host[(8 * m + l / 4 + shift) % 32], sizeof words);
          EXPECT_EQ(regs[4 * l + m], words[l % 4]) << "lane " << l << " register " << m;
        }
    }
}

TEST(SimCpAsyncVisibilityDeathTest, LdmatrixOfAnotherLanesRowBeforeABarrierFails) {
  const Chunks in(32);
  std::vector<uint32_t> regs(128);
  for (sim::Order order : kOrders)
    EXPECT_DEATH(ldmatrix_rows(in, regs, 1, /*barrier=*/false, order),
                 "SIM FAILURE: ldmatrix row reads shared bytes that thread [0-9]+'s cp.async landed with no barrier");
}

// Stage refill: after a barrier every thread reads s[31]; then thread 31 refills it. Without a
// barrier between the reads and the refill it races. The thread that completes a barrier runs on
// first: in forward order that is thread 31, which refills and lands before threads 0..30 read
// (bytes it has not published); in reverse order thread 0 completes it, and the threads that read
// before thread 31 have their read overwritten by the refill (write after read).
void refill(const Chunks& in, std::vector<uint4>& out, bool barrier, sim::Order order) {
  run_landed(in, 32, order, [&](uint4* s, int t) {
    __syncthreads();
    out[static_cast<size_t>(t)] = dev::lds16(dev::smem_addr(&s[31]));
    if (barrier) __syncthreads();
    if (t == 31) dev::cp_async_16(&s[31], &in.dev[32], 16, dev::evict_first_policy());
    dev::cp_async_commit();
    dev::cp_async_wait<0>();
    __syncthreads();
    out[static_cast<size_t>(32 + t)] = dev::lds16(dev::smem_addr(&s[31]));
  });
}

TEST(SimCpAsyncVisibility, RefillAfterABarrierPasses) {
  const Chunks in(33);
  for (sim::Order order : kOrders) {
    std::vector<uint4> out(64);
    refill(in, out, /*barrier=*/true, order);
    for (int t = 0; t < 32; ++t) {
      EXPECT_TRUE(same(out[t], in.host[31])) << "thread " << t;
      EXPECT_TRUE(same(out[32 + t], in.host[32])) << "thread " << t;
    }
  }
}

TEST(SimCpAsyncVisibilityDeathTest, RefillWhileOthersReadFails) {
  const Chunks in(33);
  std::vector<uint4> out(64);
  EXPECT_DEATH(refill(in, out, false, sim::Order::kForward),
               "SIM FAILURE: lds16 reads shared bytes that thread 31's cp.async landed with no barrier");
  EXPECT_DEATH(refill(in, out, false, sim::Order::kReverse),
               "SIM FAILURE: cp.async overwrites shared bytes that other threads read with no barrier");
}

// ---------------------------------------------------------------- barriers

__attribute__((noinline)) void block_barrier() { __syncthreads(); }

// Threads below `split` and the others reach a barrier at one call site (a helper) or at two.
void two_sites(bool same_site, std::vector<int>& out) {
  run(
      [&] {
        __shared__ int s[64];
        sim::register_shared(s, sizeof s);
        const int t = static_cast<int>(threadIdx.x);
        s[t] = 3 * t;
        if (same_site) {
          block_barrier();
        } else if (t < 32) {
          __syncthreads();
        } else {
          __syncthreads();
        }
        out[static_cast<size_t>(t)] = s[63 - t];
      },
      64, sim::Order::kForward);
}

TEST(SimBarriers, OneCallSitePasses) {
  std::vector<int> out(64, -1);
  two_sites(true, out);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], 3 * (63 - t));
}

TEST(SimBarriersDeathTest, DifferentCallSitesFail) {
  std::vector<int> out(64);
  EXPECT_DEATH(two_sites(false, out), "SIM FAILURE: threads of one block at different __syncthreads");
}

// Threads at or past `live` exit first; the others exchange values through a barrier.
TEST(SimBarriers, ExitedThreadsDoNotHoldABarrier) {
  for (sim::Order order : kOrders)
    for (int live : {1, 31, 40, 64}) {
      std::vector<int> out(64, -1);
      run(
          [&] {
            __shared__ int s[64];
            sim::register_shared(s, sizeof s);
            const int t = static_cast<int>(threadIdx.x);
            if (t >= live) return;
            s[t] = 5 * t + 1;
            __syncthreads();
            out[static_cast<size_t>(t)] = s[live - 1 - t];
            __syncthreads();
          },
          64, order);
      for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], t < live ? 5 * (live - 1 - t) + 1 : -1) << live << " " << t;
    }
}

// A thread that skips the barrier but stays alive still holds it back (here: lanes 48..63 wait at
// a __syncwarp that lanes 32..47, at the barrier, never reach).
TEST(SimBarriersDeathTest, ALiveThreadSkippingABarrierDeadlocks) {
  auto body = [] {
    run(
        [] {
          const int t = static_cast<int>(threadIdx.x);
          if (t < 48)
            __syncthreads();
          else
            __syncwarp();
        },
        64, sim::Order::kForward);
  };
  EXPECT_DEATH(body(), "SIM FAILURE: deadlock");
}

// ---------------------------------------------------------------- alignment

#if defined(DECODEGRAPH_SIM_ALIGNMENT_CHECK)
constexpr bool kAlignmentChecked = true;
#else
constexpr bool kAlignmentChecked = false;
#endif

// A store or load of a vector type `offset` bytes past a 16-byte aligned device allocation.
enum class Access { kStoreFloat4, kStoreUint4, kStoreFloat2, kStoreUint32, kLoadUint4, kLdgUint4 };
float access_at(Access a, int offset) {
  char* buf = nullptr;
  EXPECT_EQ(cudaMalloc(&buf, 64), cudaSuccess);
  EXPECT_EQ(cudaMemset(buf, 0, 64), cudaSuccess);
  float seen = 0.0f;
  run(
      [&] {
        void* p = buf + offset;
        switch (a) {
          case Access::kStoreFloat4: *reinterpret_cast<float4*>(p) = float4{1.0f, 2.0f, 3.0f, 4.0f}; break;
          case Access::kStoreUint4: *reinterpret_cast<uint4*>(p) = make_uint4(1, 2, 3, 4); break;
          case Access::kStoreFloat2: *reinterpret_cast<float2*>(p) = float2{1.0f, 2.0f}; break;
          case Access::kStoreUint32: *reinterpret_cast<uint32_t*>(p) = 0x3f800000u; break;
          case Access::kLoadUint4: seen = static_cast<float>(reinterpret_cast<const uint4*>(p)->x); break;
          case Access::kLdgUint4: seen = static_cast<float>(__ldg(reinterpret_cast<const uint4*>(p)).x); break;
        }
      },
      1, sim::Order::kForward);
  if (a != Access::kLoadUint4 && a != Access::kLdgUint4) std::memcpy(&seen, buf + offset, sizeof seen);
  cudaFree(buf);
  return seen;
}

TEST(SimAlignment, AlignedVectorAccessesPass) {
  EXPECT_EQ(access_at(Access::kStoreFloat4, 16), 1.0f);
  EXPECT_EQ(access_at(Access::kStoreUint4, 32), 1.4e-45f);  // the bits of 1u
  EXPECT_EQ(access_at(Access::kStoreFloat2, 8), 1.0f);
  EXPECT_EQ(access_at(Access::kStoreUint32, 4), 1.0f);
  EXPECT_EQ(access_at(Access::kLoadUint4, 16), 0.0f);
  EXPECT_EQ(access_at(Access::kLdgUint4, 48), 0.0f);
}

TEST(SimAlignmentDeathTest, MisalignedVectorAccessesFail) {
  // __ldg checks alignment itself; plain typed accesses need the compiler's alignment check.
  EXPECT_DEATH(access_at(Access::kLdgUint4, 8), "SIM FAILURE: __ldg misaligned");
  if (!kAlignmentChecked) GTEST_SKIP() << "built without -fsanitize=alignment: plain vector accesses unchecked";
  EXPECT_DEATH(access_at(Access::kStoreFloat4, 8), "misaligned address .*float4.*SIM FAILURE: misaligned access");
  EXPECT_DEATH(access_at(Access::kStoreUint4, 4), "misaligned address .*uint4");
  EXPECT_DEATH(access_at(Access::kStoreFloat2, 4), "misaligned address .*float2");
  EXPECT_DEATH(access_at(Access::kStoreUint32, 2), "misaligned address .*(uint32_t|unsigned int)");
  EXPECT_DEATH(access_at(Access::kLoadUint4, 8), "misaligned address .*uint4");
}

// ---------------------------------------------------------------- cub::BlockReduce

struct MaxOp {
  int operator()(int a, int b) const { return a > b ? a : b; }
};

// Two reductions over one TempStorage, with or without the barrier CUB asks for in between.
void two_reductions(bool barrier, int (&result)[2], sim::Order order) {
  run(
      [&] {
        using Reduce = cub::BlockReduce<int, 64>;
        __shared__ typename Reduce::TempStorage temp[1];
        sim::register_shared(temp, sizeof temp);
        const int t = static_cast<int>(threadIdx.x);
        const int a = Reduce(temp[0]).Reduce((t * 37) % 64, MaxOp{});
        if (barrier) __syncthreads();
        const int b = Reduce(temp[0]).Reduce(-t, MaxOp{});
        if (t == 0) {
          result[0] = a;
          result[1] = b;
        }
      },
      64, order);
}

TEST(SimCubBlockReduce, ReuseAfterABarrierPasses) {
  for (sim::Order order : kOrders) {
    int r[2] = {-1, -1};
    two_reductions(true, r, order);
    EXPECT_EQ(r[0], 63);
    EXPECT_EQ(r[1], 0);
  }
}

TEST(SimCubBlockReduceDeathTest, ReuseWithoutABarrierFails) {
  int r[2];
  for (sim::Order order : kOrders)
    EXPECT_DEATH(two_reductions(false, r, order), "SIM FAILURE: cub::BlockReduce TempStorage reused without a barrier");
}

}  // namespace
