// Kernel parameter structs, the tuning policy of the pass-1 kernel, and the declarations of the
// per-(dtype, head_size) launch functions. launch.cu includes only this header; the definitions
// live in paged_decode.cuh / merge_partitions.cuh / append_kv.cuh and are instantiated one dtype
// per file in inst/*.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decodegraph/types.hpp"

namespace decodegraph::kernels {

// ---------------------------------------------------------------- params

/// Pass 1 (V1, or V2 pass 1). Shapes as in attention.hpp. Set by the eager launcher.
struct DecodeParams {
  const void* q = nullptr;
  void* out = nullptr;  // V1 output [num_seqs, num_q_heads, head_size] (model dtype)
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lens = nullptr;
  const float* alibi_slopes = nullptr;
  // V2 partials (fp32), see V2WorkspaceLayout; null for V1.
  float* max_logits = nullptr;
  float* exp_sums = nullptr;
  float* partial_out = nullptr;

  int num_seqs = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int block_size = 0;
  int block_table_stride = 0;
  int max_seq_len = 0;
  /// Tokens per partition; V1 passes max_seq_len (one partition spans every clamped length).
  int partition_size = 0;
  /// V2: partitions per (seq, head) in the partials; V1: 1.
  int max_partitions = 1;
  float scale = 1.0f;
  KVLayout layout = KVLayout::kVLLM;

  // Filled by launch_paged_decode from the policy (the launcher's callers leave them alone).
  int group_size = 0;       // num_q_heads / num_kv_heads
  int heads_per_block = 0;  // GY: query heads a block serves (power of two)
  int head_chunks = 0;      // ceil(group_size / heads_per_block), grid y = kv_heads * head_chunks
};

/// Pass 2 of V2.
struct MergeParams {
  const float* max_logits = nullptr;
  const float* exp_sums = nullptr;
  const float* partial_out = nullptr;
  void* out = nullptr;
  const int32_t* seq_lens = nullptr;
  int num_seqs = 0;
  int num_q_heads = 0;
  int head_size = 0;
  int max_seq_len = 0;
  int partition_size = 0;
  int max_partitions = 0;
};

/// KV append (vLLM reshape_and_cache).
struct AppendParams {
  const void* key = nullptr;    // [num_tokens, kv_heads, head_size]
  const void* value = nullptr;  // [num_tokens, kv_heads, head_size]
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* slot_mapping = nullptr;  // [num_tokens]
  int num_tokens = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  int block_size = 0;
  KVLayout layout = KVLayout::kVLLM;
};

// ---------------------------------------------------------------- policy

constexpr int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}
constexpr int floor_pow2(int v) {
  int p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}
constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int cmin(int a, int b) { return a < b ? a : b; }

/// Tuning of the pass-1 kernel for element type T (2 or 4 bytes) and head size D.
/// Untuned on hardware yet: the values follow docs/architecture.md (no device in the dev loop).
template <int kElemBytes, int D>
struct DecodePolicy {
  static constexpr int kDPad = next_pow2(D);
  /// Elements per 16-byte vector.
  static constexpr int kChunkElems = 16 / kElemBytes;
  /// Elements of the head dimension each lane owns (contiguous).
  static constexpr int kVec = cmax(kChunkElems, kDPad / 32);
  /// Lanes per row (one row = one query head x one token slice); a power of two <= 32.
  static constexpr int kLanes = kDPad / kVec;
  /// Lanes owning real elements; lanes >= this idle (D = 80, 96, 112, 192 pad up).
  static constexpr int kActiveLanes = D / kVec;
  static constexpr int kChunksPerLane = kVec / kChunkElems;
  /// 16-byte chunks of one token's K (or V) row.
  static constexpr int kChunksPerToken = D / kChunkElems;
  static constexpr int kMinThreads = 128;
  static constexpr int kMaxThreads = 512;
  /// Query heads one block serves at most; bigger GQA groups split into head chunks (grid y).
  static constexpr int kMaxHeadsPerBlock = 16;
  /// Tokens staged per iteration: K + V tiles within 32 KB of shared memory, at most 64 tokens.
  static constexpr int kTile = cmin(64, floor_pow2(32768 / (2 * D * kElemBytes)));
  /// 16-byte loads each thread issues before storing them (loads in flight per array).
  static constexpr int kLoadsInFlight = 4;

  static constexpr int kMaxRows = kMaxThreads / kLanes;
  /// Rows of the slice-merge scratch: slices > 1 only happen at kMinThreads threads.
  static constexpr int kMergeRows = kMinThreads / kLanes;
  static constexpr int kSmemBytes = 2 * kTile * D * kElemBytes                 // K, V tiles
                                    + kMaxHeadsPerBlock * kTile * 4            // per-row logits
                                    + kMergeRows * (kDPad + 2) * 4;            // slice merge

  static_assert(D % kVec == 0, "every active lane owns a full vector");
  static_assert(kLanes >= 1 && kLanes <= 32 && 32 % kLanes == 0, "rows must tile a warp");
  static_assert(kVec % kChunkElems == 0, "a lane's vector is whole 16-byte chunks");
  static_assert(kTile >= kMinThreads / kLanes, "each token slice gets at least one token per tile");
  static_assert(kTile % kChunkElems == 0, "vLLM V chunks (16 B along tokens) never straddle a tile");
  static_assert(kLanes * kMaxHeadsPerBlock <= kMaxThreads, "a block holds all of its heads");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory must fit without opt-in");
};

// ---------------------------------------------------------------- launchers (inst/*.cu)
// Each checks the fault seam (Site::kKernelLaunch) right before its launch, launches, and checks
// cudaGetLastError; all throw Error. No allocation, no synchronisation: capturable.

/// V1 (write_partials = false) or V2 pass 1 over grid (partitions, kv_heads x head chunks, seqs).
template <typename T, int D>
void launch_paged_decode(DecodeParams params, bool write_partials, cudaStream_t stream);
/// cudaOccupancyMaxActiveBlocksPerMultiprocessor of the pass-1 kernel for a GQA group size.
template <typename T, int D>
int paged_decode_blocks_per_sm(int group_size);
template <typename T>
void launch_merge_partitions(const MergeParams& params, cudaStream_t stream);
template <typename T>
void launch_append_kv(const AppendParams& params, cudaStream_t stream);

}  // namespace decodegraph::kernels
