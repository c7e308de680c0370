// Self-test fixture of the kernel report (not part of the library): a pass-1 launcher the guard must
// reject. Its main loop stages V transposed with scalar 2-byte shared stores (STS.U16), and a
// dynamically indexed per-thread array puts it in local memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/decode_params.cuh"

namespace decodegraph::kernels {
namespace {

constexpr int kThreads = 128;

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) BadTransposeKernel(const __grid_constant__ DecodeParams p) {
  constexpr int kTile = 64;  // the fixture's own constant, not the library's policy
  __shared__ uint16_t s_v[kTile * D];
  float spill[32];
  const int tid = threadIdx.x;
  const int tiles = p.seq_lens[blockIdx.z] / kTile;
  const uint4* src = static_cast<const uint4*>(p.v_cache);
  float acc = 0.0f;
  for (int i = 0; i < 32; ++i) spill[i] = static_cast<float>(i * tid);
  for (int t = 0; t < tiles; ++t) {
    __syncthreads();
    for (int c = tid; c < kTile * D / 8; c += blockDim.x) {
      const uint4 v = src[static_cast<int64_t>(t) * (kTile * D / 8) + c];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) s_v[((c % kTile) * 8 + e) % (kTile * D)] = static_cast<uint16_t>(w[e / 2] >> (16 * (e % 2)));
    }
    __syncthreads();
    acc += s_v[(tid * 7 + t) % (kTile * D)] * spill[(tid + t) % 32];
    spill[(tid * 5 + t) % 32] = acc;
  }
  static_cast<float*>(p.out)[blockIdx.z * blockDim.x + tid] = acc;
}

}  // namespace

template <typename T, typename KV, int D, KVLayout L>
void launch_paged_decode(DecodeParams p, cudaStream_t stream) {
  p.heads_per_block = 1;
  BadTransposeKernel<T, D><<<dim3(1, p.num_kv_heads, p.num_seqs), kThreads, 0, stream>>>(p);
}

template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 128, KVLayout::kVLLM>(DecodeParams, cudaStream_t);

}  // namespace decodegraph::kernels
