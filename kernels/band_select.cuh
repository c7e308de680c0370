// Band selection on the device (issue 12): the length band of a step, chosen inside the graph from
// the staged seq_lens, and the value of the SWITCH nodes that run that band's attention.
//
// What it computes. m = max(seq_lens[0 .. batch)) (padded rows are 0, a negative length counts as
// 0), then band = select_band(m, edges): the first band edge >= m, i.e. lengths in
// (edges[b-1], edges[b]] are band b, as Executor::step() picks it on the host. A length past the
// last edge (possible only for unvalidated device inputs) takes the last band, whose kernels clamp
// it to that edge; m = 0 takes band 0. Thread 0 then sets every SWITCH handle of the graph to the
// band (cudaGraphSetConditional) and counts one execution of that band's branch.
//
// The math (select_band, the row max) is __host__ __device__: the host backend's conditional node
// runs the same functions on its staged buffers when the graph replays, so both backends choose the
// same branch for the same data.
//
// Mapping. One block of kBandSelectThreads threads: each takes a strided max over the rows, then a
// CUB BlockReduce combines them (the result is valid in thread 0 only, which is the only reader).
// The band search is a binary search over the edges in executor memory (any number of bands).
// This header is also included by host C++ (the executor, the host backend): only the math and the
// params are visible there.
#pragma once

#include <cstdint>

#include "decodegraph/numeric.hpp"
#include "decodegraph/types.hpp"

namespace decodegraph::kernels {

inline constexpr int kBandSelectThreads = 256;
/// SWITCH handles one band-select launch sets (one per attention call of a step body). Kept in the
/// params so the kernel needs no executor memory per graph; 256 x 8 bytes keeps them under 4 KB.
inline constexpr int kMaxSwitchHandles = 256;

/// Longest length over `n` rows; padded rows (0) and negative garbage count as 0.
DG_HD int longest_length(const int32_t* lens, int n) {
  int m = 0;
  for (int i = 0; i < n; ++i) m = lens[i] > m ? lens[i] : m;
  return m;
}

/// Band of a step whose longest sequence has `max_len` tokens: the first of the increasing `edges`
/// that is >= max_len; past the last edge, the last band.
DG_HD int select_band(int max_len, const int* edges, int num_edges) {
  int lo = 0, hi = num_edges - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (edges[mid] >= max_len)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

struct BandSelectParams {
  const int32_t* seq_lens = nullptr;  // staged [batch]; padded rows 0
  int batch = 0;
  const int* edges = nullptr;  // [num_edges] band upper edges, increasing (executor memory)
  int num_edges = 0;
  /// [num_edges] executions of each band's branch, or null (executor memory; one counter set per
  /// batch bucket, so a graph's replays are never counted twice).
  unsigned long long* branch_counts = nullptr;
  int* band_out = nullptr;  // optional: the chosen band (tests)
  int num_handles = 0;
  unsigned long long handles[kMaxSwitchHandles] = {};  // cudaGraphConditionalHandle values
};

/// Launches the band-select kernel on `stream` (capturable; checks the fault seam, kKernelLaunch,
/// and cudaGetLastError). CUDA builds (and the simulator) only.
void launch_band_select(const BandSelectParams& p, Stream stream);

/// For the one-time SWITCH probe (executor/cuda/switch_probe.cpp): the band-select kernel, and a
/// kernel that writes `value` to `*dst`, launched without the fault seam and returning the CUDA error
/// (0 = success) instead of throwing, so the probe neither consumes a test's injected fault nor throws.
int launch_band_select_for_probe(const BandSelectParams& p, Stream stream) noexcept;
int launch_probe_mark(int* dst, int value, Stream stream) noexcept;

#if defined(__CUDACC__) || defined(DECODEGRAPH_SIM)

struct MaxOp {
  DG_HD int operator()(int a, int b) const { return a > b ? a : b; }
};

#endif

}  // namespace decodegraph::kernels
