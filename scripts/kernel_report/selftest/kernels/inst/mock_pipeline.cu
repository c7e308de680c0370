// Self-test fixture of the kernel report (not part of the library): a pass-1 launcher shaped like the
// coming kernel, so the report is checked on what it must handle next. It implements the real
// launch_paged_decode<T, KV, D, Layout> declaration (kernels/decode_params.cuh) with
//   - cp.async 16-byte copies into kStages dynamic shared-memory stages (LDGSTS, LDGDEPBAR, DEPBAR),
//     the opt-in attribute set by the launcher;
//   - the layout as a template parameter (two kernel names per dtype and head size);
//   - four instantiations in one file (bf16 and fp16, head 128; and fp16 with E4M3 and E5M2 caches, whose
//     one-byte elements make the tile half the bytes and the guard's fp8 rule applies);
//   - a fully unrolled tile, plus one block-stride loop whose trip count the report must read off
//     the SASS: kScratch / 128 threads = 8 trips of one STS.128 each.
// Its numbers are meaningless as attention; only the shape of the code matters.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/decode_params.cuh"

namespace decodegraph::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kStages = 3;
constexpr int kScratch = 1024;  // uint4 per block, zeroed per tile by a block-stride loop
constexpr int kTile = 64;       // tokens per stage: the fixture's own constant, not the library's policy

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <typename T, int D, KVLayout L>
__global__ void __launch_bounds__(kThreads) MockPipelinedKernel(const __grid_constant__ DecodeParams p) {
  constexpr int kTileBytes = 2 * kTile * D * static_cast<int>(sizeof(T));  // K + V (T: the cache's element)
  constexpr int kPerThread = kTileBytes / 16 / kThreads;
  extern __shared__ uint4 smem[];  // kStages x tile, then the scratch
  uint4* scratch = smem + kStages * kTileBytes / 16;
  const int tid = threadIdx.x;
  const int tiles = p.seq_lens[blockIdx.z] / kTile;
  const char* src = static_cast<const char*>(L == KVLayout::kNHD ? p.k_cache : p.v_cache);
  float acc = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    uint4* stage = smem + (t % kStages) * kTileBytes / 16;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      cp_async16(stage + i * kThreads + tid, src + (static_cast<int64_t>(t) * kTileBytes + (i * kThreads + tid) * 16));
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();
#pragma unroll 1
    for (int i = tid; i < kScratch; i += blockDim.x) scratch[i] = make_uint4(t, i, 0, 0);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const uint4 v = stage[((i + t) % kPerThread) * kThreads + tid];
      acc += __uint_as_float(v.x) * __uint_as_float(v.y) + __uint_as_float(v.z) * __uint_as_float(v.w);
    }
    __syncthreads();
  }
  static_cast<float*>(p.out)[blockIdx.z * blockDim.x + tid] = acc;
}

template <typename T, int D, KVLayout L>
void launch_mock(const DecodeParams& p, cudaStream_t stream) {
  constexpr int smem = kStages * 2 * kTile * D * sizeof(T) + kScratch * 16;
  cudaFuncSetAttribute(MockPipelinedKernel<T, D, L>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  MockPipelinedKernel<T, D, L><<<dim3(1, p.num_kv_heads, p.num_seqs), kThreads, smem, stream>>>(p);
}

}  // namespace

template <typename T, typename KV, int D, KVLayout L>
void launch_paged_decode(DecodeParams p, cudaStream_t stream) {
  p.heads_per_block = 1;
  launch_mock<KV, D, L>(p, stream);
}

template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 128, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 128, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __half, 128, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __half, 128, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __nv_fp8_e4m3, 128, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __nv_fp8_e5m2, 128, KVLayout::kNHD>(DecodeParams, cudaStream_t);

}  // namespace decodegraph::kernels
