// Eager paged decode attention: V1 (single pass) and V2 (partitioned pass 1 + merge),
// the KV append (vLLM reshape_and_cache), and their float64 / host counterparts.
//
// Shapes (elements of spec.dtype unless noted; the caches hold one-byte codes when spec.kv_dtype is
// fp8, and x = 16 bytes / kv_elem_size() = 16 then):
//   q, out        [num_seqs, q_len, num_q_heads, head_size]: q_len rows per sequence (row (s, j) is
//                 row s * q_len + j); rows may be q_stride / out_stride elements apart (e.g. q inside
//                 a fused QKV buffer), heads contiguous
//   k_cache       kVLLM: [num_blocks, kv_heads, head_size/x, block_size, x]; kNHD: [num_blocks, block_size, kv_heads, head_size]
//   v_cache       kVLLM: [num_blocks, kv_heads, head_size, block_size];      kNHD: as k_cache
//   block_tables  int32 [num_seqs, block_table_stride]
//   seq_lens      int32 [num_seqs], each 0 .. max_seq_len; 0 marks a padded row: accepted everywhere
//                 (validation, kernels, host implementation, reference), its output left untouched
//   alibi_slopes  fp32 [num_q_heads] or null; bias = slope * (pos - seq_len + 1)
//   k_scale, v_scale  fp32 [spec.kv_scale_count()] (1, or num_kv_heads): fp8 caches only (required
//                 there, ignored for kv_dtype auto). K = float(code) * k_scale[h], V likewise; read
//                 from memory when the kernels run (a graph replay sees the values written since).
//   sinks         fp32 [num_q_heads] or null: attention sinks (gpt-oss), one raw logit per query
//                 head (not scaled, not soft-capped) that enters the softmax denominator only:
//                 o = sum_t e^(s_t - m) v_t / (e^(sink - m) + sum_t e^(s_t - m)); -inf = no sink.
//                 Read from memory when the kernels run. In V2 it enters once, in the merge.
// spec.sliding_window W > 0: each sequence attends its last W positions only; the kernels read
// neither the block-table entries nor the cache blocks wholly before them (they may hold any id and
// any bytes, NaN included). V2's partitions start at the window's first block.
// q_len n > 1 (speculative decoding: 1 + k drafted tokens verified in one step): seq_lens count all
// n new tokens; row j of a sequence of L tokens sits at position p_j = L - n + j and attends the
// positions t <= p_j (causal, bottom-right aligned as in FlashAttention and FlashInfer), with a window
// t in (p_j - W, p_j]; sinks and the soft-cap apply per row. L >= n is required (L = 0 still marks a
// padded sequence, all of whose rows are left untouched). Each K and V element is read once for all
// the rows a block serves.
#pragma once

#include <cstddef>
#include <cstdint>

#include "decodegraph/types.hpp"

namespace decodegraph {

/// The most query tokens per sequence one call takes (DecodeArgs::q_len).
inline constexpr int kMaxQLen = 16;
/// The most sequences one call takes (DecodeArgs::num_seqs): the kernels' grid z.
inline constexpr int kMaxSeqsPerLaunch = 65535;

/// Arguments of one attention call. Pointers are device pointers for the CUDA launchers and host
/// pointers for host:: functions and reference::.
struct DecodeArgs {
  AttentionSpec spec;
  int num_seqs = 0;
  /// Query tokens per sequence, 1..kMaxQLen (header comment): q and out hold num_seqs * q_len rows.
  int q_len = 1;
  /// Upper bound on every seq_len; sizes the grid (graph mode: the band's upper edge).
  int max_seq_len = 0;
  /// Row stride of block_tables, in entries. Must satisfy stride * block_size >= max_seq_len.
  int block_table_stride = 0;
  /// Number of blocks in the cache (block ids must lie in [0, num_blocks)).
  int num_blocks = 0;
  /// Elements between the rows of consecutive sequences in q and in out; 0 = contiguous
  /// (num_q_heads * head_size). Otherwise at least num_q_heads * head_size and a multiple of
  /// 16 bytes. A fused QKV buffer [num_seqs, (num_q_heads + 2 * num_kv_heads) * head_size] has
  /// q at its start with q_stride = (num_q_heads + 2 * num_kv_heads) * head_size.
  int64_t q_stride = 0;
  int64_t out_stride = 0;

  const void* q = nullptr;
  void* out = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lens = nullptr;
  const float* alibi_slopes = nullptr;
  /// fp8 caches: the dequantisation scales (header comment). The host implementation and the
  /// reference read them (host pointers) and reject a value that is not finite and > 0.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  /// Attention sinks (header comment), [num_q_heads] raw fp32 logits, or null for none. The host
  /// implementation and the reference read them (host pointers) and reject +inf and NaN.
  const float* sinks = nullptr;

  /// Optional host copy of seq_lens. The CUDA launchers never read device memory on the host (they
  /// stay capturable), so per-length checks happen only when this is given.
  const int32_t* host_seq_lens = nullptr;
  /// Optional host copy of block_tables, checked against num_blocks when given (only the entries the
  /// kernels read: with a sliding window, from the window's first block on).
  const int32_t* host_block_tables = nullptr;

  /// Optional device int (CUDA launchers only; host:: and reference:: check ids and throw instead).
  /// The kernels clamp every block id they read to [0, num_blocks), so a bad id never reads outside
  /// the cache; when this is non-null, they also record one: a bad entry (with several, whichever is
  /// published first) stores (seq * block_table_stride + index) + 1 here (atomicCAS from 0; clamped
  /// to INT_MAX), so the
  /// caller can find the entry. The caller zeroes it and reads it after the launch; a non-zero value
  /// means that output rows computed from a bad id are wrong (they used a clamped block instead).
  int* bad_block = nullptr;

  /// CUDA launchers: launch pass 1 (and V2's merge) with programmatic dependent launch (PDL,
  /// cudaLaunchAttributeProgrammaticStreamSerialization), so each may start while the kernel before
  /// it in the stream drains. Always correct: our kernels wait (griddepcontrol.wait) before any
  /// global access. Useful on sm_90+ only (elsewhere the attribute is accepted and does nothing).
  /// Off by default: an eager caller decides per stream; the executor sets it per launch
  /// (ExecutorConfig::programmatic_launch). Host and reference implementations ignore it.
  bool programmatic_launch = false;
};

/// Partitions a sequence of `len` tokens needs at partition size P.
inline int num_partitions(int len, int partition_size) {
  return len <= 0 ? 0 : (len + partition_size - 1) / partition_size;
}

/// V2 workspace: fp32 partials for num_seqs x num_q_heads x max_partitions partitions, where
/// max_partitions covers the tokens a sequence of max_seq_len reads (with a sliding window at most
/// W + block_size - 1: the window and the part of its first block before it):
/// max logits, exp sums and normalised partial outputs [.., head_size]. 256-byte aligned sub-buffers.
struct V2WorkspaceLayout {
  int max_partitions = 0;
  std::size_t max_logits_offset = 0;  // float [num_seqs, num_q_heads, max_partitions]
  std::size_t exp_sums_offset = 0;    // float [num_seqs, num_q_heads, max_partitions]
  std::size_t partial_out_offset = 0; // float [num_seqs, num_q_heads, max_partitions, head_size]
  std::size_t total_bytes = 0;
};
/// q_len > 1: partials per (sequence, row, head), num_seqs * q_len rows.
V2WorkspaceLayout v2_workspace_layout(const AttentionSpec& spec, int num_seqs, int max_seq_len,
                                      int partition_size, int q_len = 1);
/// Size query: bytes of workspace paged_attention_v2 needs (total_bytes of the layout).
std::size_t v2_workspace_size(const AttentionSpec& spec, int num_seqs, int max_seq_len,
                              int partition_size, int q_len = 1);

/// Throws Error for every invalid argument (spec, counts, strides, null/misaligned pointers, a block
/// table too narrow for max_seq_len, and host_seq_lens (0 .. max_seq_len; 0 = padded row) /
/// host_block_tables contents when given). Run by every entry point below before anything is
/// launched.
void validate_decode_args(const DecodeArgs& args);
/// Throws Error unless partition_size is a positive multiple of block_size.
void validate_partition_size(const AttentionSpec& spec, int partition_size);

/// KV append arguments (vLLM reshape_and_cache): key/value [num_tokens, num_kv_heads, head_size] in
/// the model dtype; slot_mapping int64 [num_tokens]: slot = block_id * block_size + offset; a
/// negative slot is skipped. An fp8 cache stores rne(x / scale) saturated to +-max (numeric.hpp).
/// On the device a slot at or past num_blocks * block_size is skipped too (never written out of
/// bounds); the host implementation and validation with host_slot_mapping reject it.
///
/// What is checked. Without seq_lens / block_tables (the vLLM call) only the cache bound: the
/// device skips a slot past the cache (reported in bad_slot when given), host:: throws. With them,
/// each token's slot must also be the slot of its position under its sequence's block-table row,
/// and that table entry a block id in [0, num_blocks). Tokens come in groups of n = tokens_per_seq
/// consecutive tokens of one sequence (a step of q_len = n tokens per sequence, slot_mapping
/// [num_seqs, n]): token t is token j = t % n of sequence i = t / n, at position
/// p = seq_lens[i] - n + j (seq_lens counting the n tokens appended; n = 1: p = seq_lens[t] - 1),
/// slot block_tables[i][p / block_size] * block_size + p % block_size. The device skips a token
/// whose slot differs (so a wrong slot never overwrites another sequence's token) and reports it in
/// bad_slot, which is then required; host:: throws InvalidArgument before writing anything.
struct AppendArgs {
  AttentionSpec spec;
  int num_tokens = 0;
  int num_blocks = 0;
  /// Elements between consecutive tokens' rows of key / value; 0 = contiguous
  /// (num_kv_heads * head_size). Otherwise at least num_kv_heads * head_size and a multiple of
  /// 16 bytes. In a fused QKV buffer, key = base + num_q_heads * head_size, value = key +
  /// num_kv_heads * head_size, both strides (num_q_heads + 2 * num_kv_heads) * head_size.
  int64_t key_stride = 0;
  int64_t value_stride = 0;
  const void* key = nullptr;
  const void* value = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* slot_mapping = nullptr;
  /// fp8 caches: the quantisation scales, as DecodeArgs::k_scale / v_scale (required there).
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  /// Optional host copy of slot_mapping, range-checked against num_blocks * block_size when given.
  const int64_t* host_slot_mapping = nullptr;
  /// Optional, both or neither: int32 [num_tokens / tokens_per_seq] lengths (including the tokens
  /// appended) and [num_tokens / tokens_per_seq, block_table_stride] block tables of the tokens'
  /// sequences, in the memory of the call (device for the CUDA launcher): each slot is checked
  /// against its position (see above).
  const int32_t* seq_lens = nullptr;
  const int32_t* block_tables = nullptr;
  int block_table_stride = 0;  // entries per row, >= 1 when block_tables is given
  /// Consecutive tokens per sequence (q_len) for the position check: 1..kMaxQLen; with seq_lens
  /// given num_tokens must be a multiple of it. 1: one length and table row per token (vLLM's
  /// decode). Unused without seq_lens / block_tables.
  int tokens_per_seq = 1;
  /// Optional device int (CUDA launcher; required there with block_tables). The first token whose
  /// slot is skipped stores a code here (atomicCAS from 0): -(2 * token + kind), kind 1: not the
  /// slot of its position, kind 2: past the cache; or, when the position's block-table entry is
  /// itself outside [0, num_blocks), that entry as DecodeArgs::bad_block reports it
  /// (((token / tokens_per_seq) * block_table_stride + column) + 1: its sequence's row), so both
  /// can share one int. The caller zeroes it and reads it after the launch.
  int* bad_slot = nullptr;
  /// CUDA launcher: launch with programmatic dependent launch (DecodeArgs::programmatic_launch).
  bool programmatic_launch = false;
};
void validate_append_args(const AppendArgs& args);

// ---------------------------------------------------------------- CUDA eager launchers
// Capturable: no allocation, no synchronisation, no host read of device data. Throw Error on bad
// input (before launching) and on a failed launch. Throw Error when built without CUDA.

void paged_attention_v1(const DecodeArgs& args, Stream stream);
void paged_attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                        std::size_t workspace_bytes, Stream stream);
void append_kv(const AppendArgs& args, Stream stream);

/// True when this build has CUDA and a usable device is present.
bool cuda_device_available();

// ---------------------------------------------------------------- host implementation
// Same partitioning and merge as the kernels, fp32 accumulation, sharing their math through
// kernels/decode_math.hpp. Host pointers. Padded rows (seq_len 0) leave their output untouched.
namespace host {
void paged_attention_v1(const DecodeArgs& args);
void paged_attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                        std::size_t workspace_bytes);
void append_kv(const AppendArgs& args);
}  // namespace host

// ---------------------------------------------------------------- float64 reference
namespace reference {
/// Plain-loop float64 attention gathering K/V through the block table for either layout.
/// q is read with q_stride; out64 is always contiguous [num_seqs, q_len, num_q_heads, head_size]
/// (out_stride does not apply); rows of sequences with seq_len 0 are left untouched.
void paged_attention(const DecodeArgs& args, double* out64);
}  // namespace reference

}  // namespace decodegraph
