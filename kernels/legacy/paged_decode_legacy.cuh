// LEGACY pass-1 kernel, kept only so bench_attention can run it beside the current one
// (kernels/paged_decode.cuh) in the same process: `kernel:legacy`. It is the kernel as it was before
// the cp.async rewrite (issue 9), unchanged except for its namespace, its policy's name and its
// launcher. It ignores q/out strides and does not clamp block ids (legacy.cu rejects the former).
// Instantiated only for bf16 and fp16 at head size 128 (legacy.cu), outside the library.
//
// Paged decode attention, pass 1: V1 and V2 pass 1 share one device body.
//
// What it computes. For each (sequence, query head) and each partition of P tokens of the
// sequence's context, the online-softmax state of q against the partition's keys: the max logit m,
// l = sum exp(s - m) and acc = sum exp(s - m) * v. V1 has a single partition spanning the context
// and writes acc / l in the model dtype; V2 pass 1 writes the fp32 partials (m, l, acc / l) that
// merge_partitions.cuh folds together.
//
// Mapping. Grid: x = partition (V1: 1), y = KV head x head chunk, z = sequence. A block serves one
// KV head and GY = heads_per_block query heads of its group, so K/V are read once for all of them.
// Threads form rows of LANES threads (DecodePolicy): a row is one (query head, token slice); each
// active lane owns VEC contiguous elements of the head dimension. Rows = GY heads x Z slices. Per
// iteration the block stages a tile of kTile tokens of K and V in shared memory (16-byte loads
// gathered through the block table, layouts handled only in the loader); slice z of each head
// takes tokens [z*TPR, (z+1)*TPR) of the tile: dots reduced by butterfly shuffles within the row,
// one online-softmax rescale per tile, fp32 accumulation in registers. At the end the Z slices of
// each head are merged in fixed order (deterministic) and slice 0 writes.
//
// Assumptions. Arguments validated by the launcher (validate_decode_args): 16-byte aligned
// tensors, block table wide enough for max_seq_len, supported shapes. Lengths come from device
// memory and are clamped to max_seq_len, so nothing past the block table row is ever read. Tokens
// past the end of a tile are zero-filled in shared memory and get logit -inf (weight 0).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decodegraph/fault.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/dtype_traits.cuh"

namespace decodegraph::kernels::legacy {

// ---------------------------------------------------------------- policy (as it was)

constexpr int floor_pow2(int v) {
  int p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

template <int kElemBytes, int D>
struct LegacyDecodePolicy {
  static constexpr int kDPad = next_pow2(D);
  static constexpr int kChunkElems = 16 / kElemBytes;
  static constexpr int kVec = cmax(kChunkElems, kDPad / 32);
  static constexpr int kLanes = kDPad / kVec;
  static constexpr int kActiveLanes = D / kVec;
  static constexpr int kChunksPerLane = kVec / kChunkElems;
  static constexpr int kChunksPerToken = D / kChunkElems;
  static constexpr int kMinThreads = 128;
  static constexpr int kMaxThreads = 512;
  static constexpr int kMaxHeadsPerBlock = 16;
  static constexpr int kTile = cmin(64, floor_pow2(32768 / (2 * D * kElemBytes)));
  static constexpr int kLoadsInFlight = 4;
  static constexpr int kMaxRows = kMaxThreads / kLanes;
  static constexpr int kMergeRows = kMinThreads / kLanes;
  static constexpr int kSmemBytes = 2 * kTile * D * kElemBytes + kMaxHeadsPerBlock * kTile * 4 +
                                    kMergeRows * (kDPad + 2) * 4;
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory must fit without opt-in");
};

// ---------------------------------------------------------------- tile loader

/// Stages K and V of tokens [tile_start, tile_start + kTile) of one KV head into shared memory as
/// [kTile][D] (model dtype). Tokens at or past `end` are zero-filled (V must be finite: its weight
/// is 0, and 0 * NaN would poison the sum). Every thread of the block calls it.
template <typename T, int D>
__device__ __forceinline__ void load_kv_tile(const DecodeParams& p, const int32_t* table, int kv_head,
                                             int tile_start, int end, T* s_k, T* s_v) {
  using Pol = LegacyDecodePolicy<sizeof(T), D>;
  constexpr int kTile = Pol::kTile;
  constexpr int CE = Pol::kChunkElems;
  constexpr int CPT = Pol::kChunksPerToken;
  constexpr int U = Pol::kLoadsInFlight;
  const int tid = threadIdx.x;
  const int nt = blockDim.x;
  const int bs = p.block_size;
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  const bool vllm = p.layout == KVLayout::kVLLM;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

  // K (both layouts) and V (NHD): kTile x CPT chunks of 16 B. NHD walks a token's row first (its
  // chunks are contiguous); vLLM K walks tokens first (consecutive tokens of one d/x group are
  // contiguous), so consecutive threads read consecutive 16 B either way.
  constexpr int kTotal = kTile * CPT;
  for (int base = tid; base < kTotal; base += nt * U) {
    uint4 kr[U], vr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * nt;
      kr[u] = zero;
      vr[u] = zero;
      if (i < kTotal) {
        const int t = vllm ? i % kTile : i / CPT;
        const int c = vllm ? i / kTile : i % CPT;
        const int pos = tile_start + t;
        if (pos < end) {
          const int64_t blk = __ldg(table + pos / bs);
          const int tok = pos % bs;
          const int64_t ko = math::k_offset(p.layout, blk, kv_head, tok, c * CE, p.num_kv_heads, D, bs, CE);
          kr[u] = __ldg(reinterpret_cast<const uint4*>(k_cache + ko));
          if (!vllm) {
            const int64_t vo = math::v_offset(p.layout, blk, kv_head, tok, c * CE, p.num_kv_heads, D, bs);
            vr[u] = __ldg(reinterpret_cast<const uint4*>(v_cache + vo));
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * nt;
      if (i < kTotal) {
        const int t = vllm ? i % kTile : i / CPT;
        const int c = vllm ? i / kTile : i % CPT;
        *reinterpret_cast<uint4*>(s_k + t * D + c * CE) = kr[u];
        if (!vllm) *reinterpret_cast<uint4*>(s_v + t * D + c * CE) = vr[u];
      }
    }
  }
  if (!vllm) return;

  // V (vLLM, [blocks, kv_heads, D, block_size]): a 16-byte chunk is CE consecutive tokens of one d.
  // Chunks start at multiples of CE, which divides block_size and the tile (tiles start at a
  // multiple of block_size or of kTile), so a chunk never straddles a block. Transposed into
  // [token][d] with scalar shared stores.
  constexpr int kGroups = kTile / CE;
  constexpr int kVTotal = D * kGroups;
  for (int base = tid; base < kVTotal; base += nt * U) {
    uint4 vr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * nt;
      vr[u] = zero;
      if (i < kVTotal) {
        const int g = i % kGroups;
        const int d = i / kGroups;
        const int pos0 = tile_start + g * CE;
        if (pos0 < end) {
          const int64_t blk = __ldg(table + pos0 / bs);
          const int64_t vo = math::v_offset(p.layout, blk, kv_head, pos0 % bs, d, p.num_kv_heads, D, bs);
          vr[u] = __ldg(reinterpret_cast<const uint4*>(v_cache + vo));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * nt;
      if (i < kVTotal) {
        const int g = i % kGroups;
        const int d = i / kGroups;
        const int pos0 = tile_start + g * CE;
        Chunk<T> c;
        c.raw = vr[u];
        Bits<T>* sv = reinterpret_cast<Bits<T>*>(s_v);
#pragma unroll
        for (int e = 0; e < CE; ++e) sv[(g * CE + e) * D + d] = (pos0 + e < end) ? c.bits[e] : Bits<T>(0);
      }
    }
  }
}

// ---------------------------------------------------------------- device body

/// Loads a lane's VEC elements (kChunksPerLane 16-byte vectors) starting at src as floats.
template <typename T, int D>
__device__ __forceinline__ void load_lane_vec(const T* src, float (&dst)[LegacyDecodePolicy<sizeof(T), D>::kVec]) {
  using Pol = LegacyDecodePolicy<sizeof(T), D>;
#pragma unroll
  for (int c = 0; c < Pol::kChunksPerLane; ++c) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src + c * Pol::kChunkElems);
#pragma unroll
    for (int e = 0; e < Pol::kChunkElems; ++e) dst[c * Pol::kChunkElems + e] = chunk_elem<T>(raw, e);
  }
}

template <typename T, int D>
__device__ __forceinline__ void paged_decode_body(const DecodeParams& p, bool write_partials) {
  using Pol = LegacyDecodePolicy<sizeof(T), D>;
  constexpr int kTile = Pol::kTile;
  constexpr int LANES = Pol::kLanes;
  constexpr int VEC = Pol::kVec;
  constexpr int CE = Pol::kChunkElems;

  __shared__ uint4 s_kv_raw[2 * kTile * D * sizeof(T) / 16];
  __shared__ float s_logits[Pol::kMaxHeadsPerBlock * kTile];
  __shared__ float s_merge_acc[Pol::kMergeRows * Pol::kDPad];
  __shared__ float s_merge_ml[2 * Pol::kMergeRows];
  T* s_k = reinterpret_cast<T*>(s_kv_raw);
  T* s_v = s_k + kTile * D;

  const int part = blockIdx.x;
  const int seq = blockIdx.z;
  const int kv_head = blockIdx.y / p.head_chunks;
  const int chunk = blockIdx.y % p.head_chunks;

  // NOTE(graph): the length is read from device memory at a fixed address; the grid is sized for
  // max_seq_len. These exits depend only on block indices and seq_lens, so they are block-uniform
  // and happen before any barrier. A padded row (length 0) writes nothing; a V2 partition at or past
  // the length writes nothing either, because the merge reads only live partitions.
  int len = p.seq_lens[seq];
  len = len < p.max_seq_len ? len : p.max_seq_len;  // never read past the block table row
  if (len <= 0) return;
  const int64_t start64 = static_cast<int64_t>(part) * p.partition_size;
  if (start64 >= len) return;
  const int start = static_cast<int>(start64);
  const int end = static_cast<int>(start64 + p.partition_size < len ? start64 + p.partition_size : len);

  const int tid = threadIdx.x;
  const int lane = tid % LANES;
  const int row = tid / LANES;
  const int gy = p.heads_per_block;
  const int rows = blockDim.x / LANES;
  const int zs = rows / gy;      // token slices per head (power of two)
  const int tpr = kTile / zs;    // tokens per row per tile
  const int hy = row % gy;       // rows of one slice sit next to each other: they read the same tokens
  const int z = row / gy;
  const int head_in_group = chunk * gy + hy;
  const bool head_valid = head_in_group < p.group_size;
  const int q_head = kv_head * p.group_size + head_in_group;
  const bool active = lane < Pol::kActiveLanes;
  const int d0 = lane * VEC;

  float q[VEC], acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) q[j] = acc[j] = 0.0f;
  if (head_valid && active)
    load_lane_vec<T, D>(static_cast<const T*>(p.q) + (static_cast<int64_t>(seq) * p.num_q_heads + q_head) * D + d0, q);
  const float slope = (head_valid && p.alibi_slopes != nullptr) ? p.alibi_slopes[q_head] : 0.0f;
  float m = math::neg_inf();
  float l = 0.0f;

  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.block_table_stride;
  float* my_logits = s_logits + row * tpr;  // rows * tpr = gy * kTile <= kMaxHeadsPerBlock * kTile

  // ------------------------------------------------ main loop over tiles (block-uniform bounds)
  for (int tile_start = start; tile_start < end; tile_start += kTile) {
    __syncthreads();  // previous tile fully consumed before it is overwritten
    load_kv_tile<T, D>(p, table, kv_head, tile_start, end, s_k, s_v);
    __syncthreads();

    // Scores of this row's TPR tokens. Every lane of the warp runs every iteration (the shuffles use
    // the full mask; rows of LANES lanes are aligned groups of the warp, and xor offsets < LANES stay
    // inside the row). After the butterfly every lane holds the same bitwise sum.
    float tile_max = math::neg_inf();
    for (int i = 0; i < tpr; ++i) {
      const int t = z * tpr + i;
      float dot = 0.0f;
      if (active) {
        float k[VEC];
        load_lane_vec<T, D>(s_k + t * D + d0, k);
#pragma unroll
        for (int j = 0; j < VEC; ++j) dot = fmaf(q[j], k[j], dot);
      }
#pragma unroll
      for (int off = LANES / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      const int pos = tile_start + t;
      const float s = pos < end ? math::logit(dot, p.scale, slope, pos, len) : math::neg_inf();
      if (lane == 0) my_logits[i] = s;
      tile_max = fmaxf(tile_max, s);
    }
    __syncwarp();

    // One rescale per tile, then accumulate p * v (zero-filled V past the end keeps this finite).
    const float f = math::online_rescale(m, l, tile_max);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] *= f;
    for (int i = 0; i < tpr; ++i) {
      const float w = math::exp_shifted(my_logits[i], m);
      l += w;
      if (active) {
        float v[VEC];
        load_lane_vec<T, D>(s_v + (z * tpr + i) * D + d0, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] = fmaf(w, v[j], acc[j]);
      }
    }
  }

  // ------------------------------------------------ merge the token slices of each head
  // zs > 1 only at kMinThreads threads, so rows - gy <= kMergeRows. Fixed order: deterministic.
  if (zs > 1) {
    if (z > 0) {
      const int slot = (z - 1) * gy + hy;
      if (active) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) s_merge_acc[slot * Pol::kDPad + d0 + j] = acc[j];
      }
      if (lane == 0) {
        s_merge_ml[2 * slot] = m;
        s_merge_ml[2 * slot + 1] = l;
      }
    }
    __syncthreads();
    if (z == 0) {
      for (int zz = 1; zz < zs; ++zz) {
        const int slot = (zz - 1) * gy + hy;
        const math::MergeFactors mf = math::merge_factors(m, s_merge_ml[2 * slot]);
        l = l * mf.fa + s_merge_ml[2 * slot + 1] * mf.fb;
        if (active) {
#pragma unroll
          for (int j = 0; j < VEC; ++j)
            acc[j] = acc[j] * mf.fa + s_merge_acc[slot * Pol::kDPad + d0 + j] * mf.fb;
        }
        m = mf.m;
      }
    }
  }
  if (z != 0 || !head_valid) return;  // no barrier below

  // ------------------------------------------------ write
  if (write_partials) {
    const int64_t idx = math::partial_index(seq, q_head, part, p.num_q_heads, p.max_partitions);
    if (lane == 0) {
      p.max_logits[idx] = m;
      p.exp_sums[idx] = l;
    }
    if (active) {
      float* dst = p.partial_out + idx * D + d0;
#pragma unroll
      for (int c = 0; c < VEC / 4; ++c) {
        float4 o;
        o.x = math::normalise(acc[4 * c + 0], l);
        o.y = math::normalise(acc[4 * c + 1], l);
        o.z = math::normalise(acc[4 * c + 2], l);
        o.w = math::normalise(acc[4 * c + 3], l);
        *reinterpret_cast<float4*>(dst + 4 * c) = o;
      }
    }
  } else if (active) {
    T* dst = static_cast<T*>(p.out) + (static_cast<int64_t>(seq) * p.num_q_heads + q_head) * D + d0;
#pragma unroll
    for (int c = 0; c < Pol::kChunksPerLane; ++c) {
      Chunk<T> o;
#pragma unroll
      for (int e = 0; e < CE; ++e) o.bits[e] = float_to_bits<T>(math::normalise(acc[c * CE + e], l));
      *reinterpret_cast<uint4*>(dst + c * CE) = o.raw;
    }
  }
}

// ---------------------------------------------------------------- kernels

template <typename T, int D>
__global__ void __launch_bounds__(512) PagedDecodeV1Kernel(const __grid_constant__ DecodeParams p) {
  paged_decode_body<T, D>(p, /*write_partials=*/false);
}

template <typename T, int D>
__global__ void __launch_bounds__(512) PagedDecodeV2Kernel(const __grid_constant__ DecodeParams p) {
  paged_decode_body<T, D>(p, /*write_partials=*/true);
}

// ---------------------------------------------------------------- launcher

template <typename T, int D>
int paged_decode_threads(int group_size) {
  using Pol = LegacyDecodePolicy<sizeof(T), D>;
  return cmax(Pol::kMinThreads, Pol::kLanes * next_pow2(cmin(group_size, Pol::kMaxHeadsPerBlock)));
}

template <typename T, int D>
void launch_paged_decode(DecodeParams p, cudaStream_t stream) {
  using Pol = LegacyDecodePolicy<sizeof(T), D>;
  p.group_size = p.num_q_heads / p.num_kv_heads;
  const int gy = next_pow2(cmin(p.group_size, Pol::kMaxHeadsPerBlock));
  p.heads_per_block = gy;
  p.head_chunks = (p.group_size + gy - 1) / gy;
  const int threads = paged_decode_threads<T, D>(p.group_size);
  require(p.num_seqs <= 65535, "num_seqs", p.num_seqs, "at most 65535 per launch");
  require(p.num_kv_heads * p.head_chunks <= 65535, "num_kv_heads", p.num_kv_heads,
          "at most 65535 / head chunks per launch");
  const dim3 grid(static_cast<unsigned>(p.write_partials ? p.max_partitions : 1),
                  static_cast<unsigned>(p.num_kv_heads * p.head_chunks), static_cast<unsigned>(p.num_seqs));
  const char* name = p.write_partials ? "legacy::PagedDecodeV2Kernel" : "legacy::PagedDecodeV1Kernel";
  if (fault::should_fail(fault::Site::kKernelLaunch))
    fault::throw_injected(fault::Site::kKernelLaunch, std::string("launch of ") + name);
  if (p.write_partials)
    PagedDecodeV2Kernel<T, D><<<grid, threads, 0, stream>>>(p);
  else
    PagedDecodeV1Kernel<T, D><<<grid, threads, 0, stream>>>(p);
  DG_CUDA_CHECK_LAUNCH(name);
}

}  // namespace decodegraph::kernels::legacy
