// Kernel parameter structs and the declarations of the per-(dtype, cache type, head_size, layout)
// launch functions. launch.cu includes only this header; the definitions live in paged_decode.cuh /
// merge_partitions.cuh / append_kv.cuh and are instantiated in inst/*.cu (one dtype x layout per
// file, so they compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decodegraph/types.hpp"
#include "kernels/decode_policy.hpp"

namespace decodegraph::kernels {

// ---------------------------------------------------------------- params

/// Pass 1 (V1, or V2 pass 1). Shapes as in attention.hpp. Set by the eager launcher.
struct DecodeParams {
  const void* q = nullptr;  // rows of [num_q_heads, head_size], q_stride elements apart
  void* out = nullptr;      // V1 output rows (model dtype), out_stride elements apart
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lens = nullptr;
  const float* alibi_slopes = nullptr;
  /// fp8 caches: fp32 dequantisation scales, [num_kv_heads] when scale_per_head, else [1]; read
  /// once per block (NOTE(graph): from memory, so a graph replay sees new values).
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  bool scale_per_head = false;
  /// fp8 caches: q and out are bf16 (else fp16). The fp8 kernels' mma runs on fp16 either way, so
  /// the model dtype is a run-time choice outside the main loop, not a second instantiation.
  bool io_bf16 = false;
  // V2 partials (fp32), see V2WorkspaceLayout; null for V1.
  float* max_logits = nullptr;
  float* exp_sums = nullptr;
  float* partial_out = nullptr;
  /// Optional: set to (seq * block_table_stride + index) + 1 of a block id outside [0, num_blocks)
  /// (first writer wins); such ids are clamped, never dereferenced.
  int* bad_block = nullptr;

  int num_seqs = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int block_size = 0;
  int block_table_stride = 0;
  int num_blocks = 0;
  int max_seq_len = 0;
  /// Elements between consecutive sequences' rows of q / out (resolved: never 0 here).
  int64_t q_stride = 0;
  int64_t out_stride = 0;
  /// Tokens per partition; V1 passes max_seq_len (one partition spans every clamped length).
  int partition_size = 0;
  /// V2: partitions per (seq, head) in the partials; V1: 1.
  int max_partitions = 1;
  float scale = 1.0f;
  float scale2 = 1.0f;  ///< scale * log2(e) (math::kLog2e), formed once per launch: base-2 logits
  /// Sliding window W (0: none): partitions start at the window's first block (math::window_origin),
  /// and tokens before len - W in it are masked; blocks before it are never read.
  int window = 0;
  /// Query rows per sequence (DecodeArgs::q_len): q and out hold num_seqs * q_len rows; row j of a
  /// sequence of L tokens attends t <= L - q_len + j. The reads follow read_window =
  /// math::read_window(window, q_len) (row 0's); each row masks its own window and its causal end.
  int q_len = 1;
  int read_window = 0;
  /// math::window_span(window): a row attends the tokens whose distance before its query,
  /// (unsigned)(query - pos), is at most this (W - 1; INT_MAX without a window, which also masks
  /// every token after the query: its distance wraps above INT_MAX). One compare masks both ends.
  uint32_t window_span = 0x7fffffffu;
  /// Soft-cap in base 2 (c * log2(e)); 0: off.
  float cap2 = 0.0f;
  float cap2_k = 0.0f;  ///< math::softcap2_k(cap2), formed once per launch
  /// Attention sinks, fp32 [num_q_heads] raw logits, or null. V1 adds each to its row's softmax
  /// denominator; V2 pass 1 ignores them (the merge adds them). NOTE(graph): read from memory.
  const float* sinks = nullptr;
  KVLayout layout = KVLayout::kVLLM;
  /// V2 pass 1 (fp32 partials) rather than V1 (normalised output).
  bool write_partials = false;

  // Filled by launch_paged_decode from the policy (the launcher's callers leave them alone).
  int q_group = 0;          // num_q_heads / num_kv_heads: the query heads of one KV head
  /// The query rows one KV head serves (pass1_rows): row v (0 .. group_size - 1) is query token
  /// v >> q_shift of the sequence and head kv_head * q_group + (v & q_mask), a padding row when
  /// (v & q_mask) >= q_group (q_row_token, q_row_head, q_row_real). One token: q_shift 31, q_mask
  /// ~0, so row v is head v, as before rows had tokens.
  int group_size = 0;
  int q_shift = 31;
  int q_mask = -1;
  int heads_per_block = 0;  // query rows (warps) a block serves
  int head_chunks = 0;      // ceil(group_size / heads_per_block); grid y = kv_heads * head_chunks
  uint64_t head_chunks_magic = 0;  // small_div_magic(head_chunks): grid y / head_chunks, no division
  int block_size_log2 = 0;
  /// Host side only: launch with programmatic stream serialization (PDL; kernel_launch.cuh).
  bool programmatic = false;
};


/// Query row v of a KV head (DecodeParams::group_size): its token within the sequence, its head,
/// and whether it is a real row (not padding).
__host__ __device__ inline int q_row_token(const DecodeParams& p, int v) { return v >> p.q_shift; }
__host__ __device__ inline int q_row_head(const DecodeParams& p, int kv_head, int v) {
  return kv_head * p.q_group + (v & p.q_mask);
}
__host__ __device__ inline bool q_row_real(const DecodeParams& p, int v) { return (v & p.q_mask) < p.q_group; }

/// Pass 2 of V2.
struct MergeParams {
  const float* max_logits = nullptr;
  const float* exp_sums = nullptr;
  const float* partial_out = nullptr;
  void* out = nullptr;
  const int32_t* seq_lens = nullptr;
  int64_t out_stride = 0;  // elements between consecutive sequences' output rows (resolved)
  int num_seqs = 0;
  int num_q_heads = 0;
  int head_size = 0;
  int max_seq_len = 0;
  int partition_size = 0;
  int max_partitions = 0;
  /// As DecodeParams': partitions start at the window's first block; the sinks join the denominator.
  int window = 0;            // DecodeParams::read_window
  int block_size = 0;
  const float* sinks = nullptr;
  int q_len = 1;             // query rows per sequence: num_seqs counts rows, seq_lens sequences
  bool programmatic = false;  // host side only: launch with PDL (kernel_launch.cuh)
};

/// KV append (vLLM reshape_and_cache).
struct AppendParams {
  const void* key = nullptr;    // token rows of [kv_heads, head_size], key_stride elements apart
  const void* value = nullptr;  // likewise, value_stride elements apart
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* slot_mapping = nullptr;  // [num_tokens]
  /// Optional (both or neither): the lengths and block-table rows of the tokens' sequences, one per
  /// tokens_per_seq consecutive tokens; a slot that is not that of its position seq_len -
  /// tokens_per_seq + j is skipped and reported (kernels/append_report.hpp).
  const int32_t* seq_lens = nullptr;      // [num_tokens / tokens_per_seq]
  const int32_t* block_tables = nullptr;  // [num_tokens / tokens_per_seq, block_table_stride]
  /// Optional: the first skipped slot's report code (append_report_code; first writer wins).
  int* bad_slot = nullptr;
  int64_t key_stride = 0;                 // resolved (never 0 here)
  int64_t value_stride = 0;
  int num_blocks = 0;  // slots at or past num_blocks * block_size are skipped
  int block_table_stride = 0;
  int tokens_per_seq = 1;  // AppendArgs::tokens_per_seq (q_len)
  int num_tokens = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  int block_size = 0;
  KVLayout layout = KVLayout::kVLLM;
  /// fp8 caches: the quantisation scales (as DecodeParams'); null otherwise.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  bool scale_per_head = false;
  bool programmatic = false;  // host side only: launch with PDL (kernel_launch.cuh)
};

// ---------------------------------------------------------------- launchers (inst/*.cu)
// Each checks the fault seam (Site::kKernelLaunch) right before its launch, launches, and checks
// cudaGetLastError; all throw Error. No allocation, no synchronisation, no attribute setting:
// capturable.

/// V1 (params.write_partials = false) or V2 pass 1 over grid (partitions, kv_heads x head chunks, seqs).
/// T: the element type of q, out and the math; KV: of the cache (T, or __nv_fp8_e4m3 /
/// __nv_fp8_e5m2 with T = __half and q / out fp16 or bf16 by params.io_bf16: inst/decode_fp8*.cu).
template <typename T, typename KV, int D, KVLayout kLayout>
void launch_paged_decode(DecodeParams params, cudaStream_t stream);
/// cudaOccupancyMaxActiveBlocksPerMultiprocessor of that pass-1 kernel at the block size and
/// dynamic shared memory (none) launch_paged_decode uses for a GQA group size.
template <typename T, typename KV, int D, KVLayout kLayout>
int paged_decode_blocks_per_sm(int group_size);
/// The tensor-core pass-1 kernel (T = __half, __nv_bfloat16; inst/decode_tc_*.cu, so its code
/// compiles apart from the CUDA-core kernels): the launch launch_paged_decode selects for groups of
/// 4 or more (params' derived fields set, fault seam passed), and its blocks per SM.
template <typename T, typename KV, int D, KVLayout kLayout>
void enqueue_paged_decode_tc(const DecodeParams& params, cudaStream_t stream, const char* name);
template <typename T, typename KV, int D, KVLayout kLayout>
int paged_decode_tc_blocks_per_sm();
template <typename T>
void launch_merge_partitions(const MergeParams& params, cudaStream_t stream);
/// T: the element type of key / value; KV: of the cache (T, or an fp8 code type: quantising).
template <typename T, typename KV>
void launch_append_kv(const AppendParams& params, cudaStream_t stream);

}  // namespace decodegraph::kernels
