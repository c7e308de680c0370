// The device's read bandwidth, measured in the same run as the attention benchmarks: a streaming
// read of a buffer far larger than L2 (the H200 has 50 MB), 16-byte loads, grid-stride, each thread
// folding what it read into one value that is written only when impossible (keeps the loads live
// without adding write traffic). One grid of exactly one resident wave; each timed sample is 4
// back-to-back passes between two CUDA events. GB/s = 1e9 bytes / s.
// The device-to-device copy bandwidth (cudaMemcpyAsync between two such buffers) is the second
// reference: it counts the bytes read plus the bytes written, as copy bandwidths are quoted.
#include <algorithm>
#include <vector>

#include "bench_common.hpp"

namespace dgbench {
namespace {

__global__ void StreamingReadKernel(const uint4* __restrict__ src, std::size_t n_vec, unsigned int* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned int acc = 0;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Unrolled by 4 so several loads are in flight per thread.
  for (; i + 3 * stride < n_vec; i += 4 * stride) {
    const uint4 a = __ldcs(src + i);
    const uint4 b = __ldcs(src + i + stride);
    const uint4 c = __ldcs(src + i + 2 * stride);
    const uint4 d = __ldcs(src + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n_vec; i += stride) {
    const uint4 a = __ldcs(src + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

std::size_t default_bandwidth_buffer_bytes() {
  int dev = 0;
  DGB_CUDA_CHECK(cudaGetDevice(&dev));
  int l2 = 0;
  DGB_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  std::size_t free_b = 0, total_b = 0;
  DGB_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  std::size_t bytes = std::max<std::size_t>(std::size_t{16} * static_cast<std::size_t>(l2), std::size_t{1} << 30);
  bytes = std::min(bytes, free_b / 4);
  return bytes / 16 * 16;
}

ReadBandwidth measure_read_bandwidth(std::size_t bytes, int iters) {
  ReadBandwidth r;
  bytes = bytes / 16 * 16;
  r.buffer_bytes = bytes;
  r.iterations = iters;
  int dev = 0, sms = 0;
  DGB_CUDA_CHECK(cudaGetDevice(&dev));
  DGB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  void* buf = nullptr;
  unsigned int* sink = nullptr;
  DGB_CUDA_CHECK(cudaMalloc(&buf, bytes));
  DGB_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned int)));
  DGB_CUDA_CHECK(cudaMemset(buf, 0x5a, bytes));
  cudaStream_t stream = nullptr;
  DGB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  DGB_CUDA_CHECK(cudaEventCreate(&e0));
  DGB_CUDA_CHECK(cudaEventCreate(&e1));
  const int threads = 512;
  // Exactly one resident wave: a grid larger than what fits (registers may allow fewer than 4
  // blocks of 512 per SM) would leave a second, partial wave that idles most SMs and understates
  // the bandwidth, which would overstate every "% of read bandwidth".
  int per_sm = 0;
  DGB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, StreamingReadKernel, threads, 0));
  const int blocks = sms * std::max(per_sm, 1);
  const std::size_t n_vec = bytes / 16;
  // Several passes per timed sample, so the gap between the start event and the first kernel
  // (launch latency, a few us) is amortised.
  constexpr int kPasses = 4;
  std::vector<double> gbs;
  for (int it = -1; it < iters; ++it) {  // it = -1: warm-up
    DGB_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int pass = 0; pass < kPasses; ++pass) {
      StreamingReadKernel<<<blocks, threads, 0, stream>>>(static_cast<const uint4*>(buf), n_vec, sink);
      DGB_CUDA_CHECK(cudaGetLastError());
    }
    DGB_CUDA_CHECK(cudaEventRecord(e1, stream));
    DGB_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DGB_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 0 && ms > 0) gbs.push_back(static_cast<double>(bytes) * kPasses / (ms * 1e-3) / 1e9);
  }
  r.median_gbs = percentile(gbs, 50);
  r.best_gbs = gbs.empty() ? 0 : *std::max_element(gbs.begin(), gbs.end());
  DGB_CUDA_CHECK(cudaEventDestroy(e0));
  DGB_CUDA_CHECK(cudaEventDestroy(e1));
  DGB_CUDA_CHECK(cudaStreamDestroy(stream));
  DGB_CUDA_CHECK(cudaFree(sink));
  DGB_CUDA_CHECK(cudaFree(buf));
  return r;
}

ReadBandwidth measure_copy_bandwidth(std::size_t bytes, int iters) {
  ReadBandwidth r;
  bytes = bytes / 16 * 16;
  r.buffer_bytes = bytes;
  r.iterations = iters;
  void* src = nullptr;
  void* dst = nullptr;
  DGB_CUDA_CHECK(cudaMalloc(&src, bytes));
  DGB_CUDA_CHECK(cudaMalloc(&dst, bytes));
  DGB_CUDA_CHECK(cudaMemset(src, 0x5a, bytes));
  cudaStream_t stream = nullptr;
  DGB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  DGB_CUDA_CHECK(cudaEventCreate(&e0));
  DGB_CUDA_CHECK(cudaEventCreate(&e1));
  constexpr int kPasses = 4;  // as above: amortise the gap before the first copy
  std::vector<double> gbs;
  for (int it = -1; it < iters; ++it) {  // it = -1: warm-up
    DGB_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int pass = 0; pass < kPasses; ++pass)
      DGB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    DGB_CUDA_CHECK(cudaEventRecord(e1, stream));
    DGB_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DGB_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    // read + write
    if (it >= 0 && ms > 0) gbs.push_back(2.0 * static_cast<double>(bytes) * kPasses / (ms * 1e-3) / 1e9);
  }
  r.median_gbs = percentile(gbs, 50);
  r.best_gbs = gbs.empty() ? 0 : *std::max_element(gbs.begin(), gbs.end());
  DGB_CUDA_CHECK(cudaEventDestroy(e0));
  DGB_CUDA_CHECK(cudaEventDestroy(e1));
  DGB_CUDA_CHECK(cudaStreamDestroy(stream));
  DGB_CUDA_CHECK(cudaFree(dst));
  DGB_CUDA_CHECK(cudaFree(src));
  return r;
}

}  // namespace dgbench
