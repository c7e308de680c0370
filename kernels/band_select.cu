// The band-select kernel and its launcher (kernels/band_select.cuh says what it computes).
// Under the CPU simulator, tests/sim/shim provides cub::BlockReduce's used subset and a recording
// cudaGraphSetConditional (sim_band_select.hpp).
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "kernels/band_select.cuh"
#include "kernels/cuda_check.hpp"
#include "kernels/device_ops.cuh"

#if defined(DECODEGRAPH_SIM)
#include "sim_band_select.hpp"
#endif

namespace decodegraph::kernels {

template <int kThreads>
__global__ void __launch_bounds__(kThreads) BandSelectKernel(const __grid_constant__ BandSelectParams p) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage temp[1];
  // Launched without the PDL attribute (its predecessors are the staging copies, its successors the
  // SWITCH nodes: no kernel edge to overlap); the wait keeps it correct if it ever is.
  dev::grid_dependency_wait();
  int m = 0;
  for (int i = static_cast<int>(threadIdx.x); i < p.batch; i += kThreads) {
    const int len = __ldg(p.seq_lens + i);
    m = len > m ? len : m;
  }
  const int longest = Reduce(temp[0]).Reduce(m, MaxOp{});  // valid in thread 0 only
  if (threadIdx.x != 0) return;
  const int band = select_band(longest, p.edges, p.num_edges);
  // NOTE(graph): every SWITCH node of the graph reads its handle after this kernel (stream order);
  // one thread sets them, so the sets never race.
  for (int h = 0; h < p.num_handles; ++h) cudaGraphSetConditional(p.handles[h], static_cast<unsigned>(band));
  if (p.branch_counts) p.branch_counts[band] += 1;  // one thread of one block: no atomic needed
  if (p.band_out) *p.band_out = band;
}

void launch_band_select(const BandSelectParams& p, Stream stream) {
  if (p.batch < 1) throw_invalid("band select batch", p.batch, ">= 1");
  if (p.num_edges < 1) throw_invalid("band select num_edges", p.num_edges, ">= 1");
  if (p.num_handles < 0 || p.num_handles > kMaxSwitchHandles)
    throw_invalid("band select num_handles", p.num_handles, "0.." + std::to_string(kMaxSwitchHandles));
  if (fault::should_fail(fault::Site::kKernelLaunch))
    fault::throw_injected(fault::Site::kKernelLaunch, "launch of BandSelectKernel");
  BandSelectKernel<kBandSelectThreads><<<1, kBandSelectThreads, 0, stream>>>(p);
  DG_CUDA_CHECK_LAUNCH("BandSelectKernel");
}

#if !defined(DECODEGRAPH_SIM)
__global__ void ProbeMarkKernel(int* dst, int value) { *dst = value; }

int launch_band_select_for_probe(const BandSelectParams& p, Stream stream) noexcept {
  BandSelectKernel<kBandSelectThreads><<<1, kBandSelectThreads, 0, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int launch_probe_mark(int* dst, int value, Stream stream) noexcept {
  ProbeMarkKernel<<<1, 1, 0, stream>>>(dst, value);
  return static_cast<int>(cudaGetLastError());
}
#endif

}  // namespace decodegraph::kernels
