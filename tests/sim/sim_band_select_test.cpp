// The band-select kernel (kernels/band_select.cu) under the CPU simulator, against a host
// computation written here with plain loops: random lengths and band edges, lengths exactly at an
// edge, padded rows of length 0, batches past one block's threads, and the SWITCH values and
// branch counters it sets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/band_select.cuh"
#include "sim_band_select.hpp"
#include "sim_runtime.hpp"

#ifndef DECODEGRAPH_SIM
#error "built against the simulator shims only"
#endif

namespace {
using decodegraph::kernels::BandSelectParams;
using decodegraph::kernels::kBandSelectThreads;
using decodegraph::kernels::launch_band_select;

// The band by definition: lengths in (edges[b-1], edges[b]] are band b; past the last edge, the
// last band; 0 (only padded rows) is band 0. A linear scan, unlike the kernel's binary search.
int expected_band(const std::vector<int32_t>& lens, const std::vector<int>& edges) {
  int longest = 0;
  for (int32_t l : lens) longest = std::max<int>(longest, l);
  for (std::size_t b = 0; b < edges.size(); ++b)
    if (longest <= edges[b]) return static_cast<int>(b);
  return static_cast<int>(edges.size()) - 1;
}

template <typename T>
T* device_copy(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<std::size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  if (!v.empty()) EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

struct Selection {
  int band = -1;
  std::vector<unsigned long long> counts;
};

// One launch over `lens` (in a buffer of exactly that many rows) with `handles` SWITCH handles.
Selection run_select(const std::vector<int32_t>& lens, const std::vector<int>& edges, int handles) {
  int32_t* d_lens = device_copy(lens);
  int* d_edges = device_copy(edges);
  unsigned long long* d_counts = device_copy(std::vector<unsigned long long>(edges.size(), 0));
  int* d_band = device_copy(std::vector<int>{-1});
  BandSelectParams p;
  p.seq_lens = d_lens;
  p.batch = static_cast<int>(lens.size());
  p.edges = d_edges;
  p.num_edges = static_cast<int>(edges.size());
  p.branch_counts = d_counts;
  p.band_out = d_band;
  p.num_handles = handles;
  for (int h = 0; h < handles; ++h) p.handles[h] = 1000 + 7 * h;
  sim::conditional_values().clear();
  launch_band_select(p, nullptr);
  Selection r;
  r.counts.resize(edges.size());
  EXPECT_EQ(cudaMemcpy(&r.band, d_band, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.counts.data(), d_counts, r.counts.size() * sizeof(unsigned long long),
                       cudaMemcpyDeviceToHost), cudaSuccess);
  for (int h = 0; h < handles; ++h) {
    const auto it = sim::conditional_values().find(1000 + 7 * h);
    if (it == sim::conditional_values().end())
      ADD_FAILURE() << "handle " << h << " was not set";
    else
      EXPECT_EQ(static_cast<int>(it->second), r.band) << "handle " << h;
  }
  EXPECT_EQ(sim::conditional_values().size(), static_cast<std::size_t>(handles));
  cudaFree(d_lens);
  cudaFree(d_edges);
  cudaFree(d_counts);
  cudaFree(d_band);
  return r;
}

std::vector<int> random_edges(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> count(1, 12), step(1, 3000);
  std::vector<int> e(count(rng));
  int at = 0;
  for (int& x : e) x = at += step(rng);
  return e;
}

TEST(SimBandSelect, RandomLengthsAndEdges) {
  std::mt19937_64 rng(20240612);
  for (int trial = 0; trial < 40; ++trial) {
    const std::vector<int> edges = random_edges(rng);
    // Batches below, at and past one block's threads (each thread then takes several rows).
    const int batch = std::vector<int>{1, 7, 17, 255, 256, 257, 600}[trial % 7];
    std::uniform_int_distribution<int> len(1, edges.back() + 50);  // sometimes past the last edge
    std::vector<int32_t> lens(batch);
    for (int32_t& l : lens) l = len(rng);
    const Selection r = run_select(lens, edges, 1 + trial % 5);
    const int want = expected_band(lens, edges);
    ASSERT_EQ(r.band, want) << "trial " << trial << " batch " << batch;
    for (std::size_t b = 0; b < edges.size(); ++b) EXPECT_EQ(r.counts[b], b == static_cast<std::size_t>(want) ? 1u : 0u);
  }
}

TEST(SimBandSelect, LengthsExactlyAtAndAroundEachEdge) {
  const std::vector<int> edges = {512, 1024, 2048, 4096, 8192, 8448};
  for (std::size_t b = 0; b < edges.size(); ++b) {
    for (const int delta : {-1, 0, 1}) {
      const int longest = edges[b] + delta;
      // The longest length sits in a different row each time, among shorter ones.
      std::vector<int32_t> lens(300, 1);
      lens[(b * 97 + 3 * (delta + 1)) % lens.size()] = longest;
      const Selection r = run_select(lens, edges, 2);
      ASSERT_EQ(r.band, expected_band(lens, edges)) << "longest " << longest;
      if (delta == 0) EXPECT_EQ(r.band, static_cast<int>(b)) << "an edge belongs to the band below it";
    }
  }
}

TEST(SimBandSelect, PaddedRowsAreZeroAndDoNotCount) {
  const std::vector<int> edges = {512, 1024, 8192, 8448};
  std::vector<int32_t> lens = {900, 0, 0, 0, 0, 0, 0, 0};  // batch 1 padded to a bucket of 8
  EXPECT_EQ(run_select(lens, edges, 1).band, 1);
  lens.assign(8, 0);  // only padded rows: band 0
  EXPECT_EQ(run_select(lens, edges, 1).band, 0);
  lens = {0, 0, 0, 8193};  // the live row last
  EXPECT_EQ(run_select(lens, edges, 1).band, 3);
}

TEST(SimBandSelect, NoHandlesStillCountsAndOneThreadSetsThemAll) {
  const std::vector<int> edges = {100, 200};
  const std::vector<int32_t> lens = {150, 3};
  const Selection r0 = run_select(lens, edges, 0);
  EXPECT_EQ(r0.band, 1);
  EXPECT_EQ(r0.counts[1], 1u);
  const Selection rmax = run_select(lens, edges, decodegraph::kernels::kMaxSwitchHandles);
  EXPECT_EQ(rmax.band, 1);
}

}  // namespace
