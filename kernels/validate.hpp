// Internal: argument checks shared by the two V2 entry points (the CUDA launcher and host::), and
// the row strides every implementation resolves the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decodegraph/attention.hpp"

namespace decodegraph::detail {

/// validate_decode_args, validate_partition_size, then the workspace pointer (non-null, 16-byte
/// aligned) and size. Returns the workspace layout the checks computed.
V2WorkspaceLayout validate_v2_args(const DecodeArgs& args, int partition_size, const void* workspace,
                                   std::size_t workspace_bytes);

/// fp8 caches: every value behind k_scale and v_scale (host pointers, spec.kv_scale_count() each) is
/// finite and > 0, else InvalidArgument naming it. Nothing for kv_dtype auto.
void check_host_scales(const AttentionSpec& spec, const float* k_scale, const float* v_scale);
/// Attention sinks (host pointer, spec.num_q_heads values, or null): each a finite logit or -inf,
/// else InvalidArgument naming it.
void check_host_sinks(const AttentionSpec& spec, const float* sinks);
/// Throws InvalidArgument naming `param` unless `slot` is the slot of position len - 1 under `row`
/// (kernels/append_report.hpp position_slot), and that position's block id (naming the entry)
/// unless it is in [0, num_blocks); `row_name` names the row in the message ("block_tables[3]"),
/// `position` says which position len - 1 is ("seq_len - 1"; for token 2 of q_len tokens
/// "seq_len - q_len + 2"). Shared by host::append_kv and the executor's kFull check.
void require_position_slot(const std::string& param, int64_t slot, int len, const int32_t* row,
                           int block_table_stride, int block_size, int num_blocks, const std::string& row_name,
                           const std::string& position = "seq_len - 1");
/// What require_position_slot accepts, without forming a message: callers check each token with it
/// and name only a token that fails (the checks run per token of every kFull or host-append step).
bool position_slot_ok(int64_t slot, int len, const int32_t* row, int block_table_stride, int block_size,
                      int num_blocks);

/// Elements between consecutive sequences' rows of q / out, and tokens' rows of key / value:
/// the stride given, or one packed row when it is 0.
inline int64_t q_row_stride(const DecodeArgs& a) {
  return a.q_stride != 0 ? a.q_stride : static_cast<int64_t>(a.spec.num_q_heads) * a.spec.head_size;
}
inline int64_t out_row_stride(const DecodeArgs& a) {
  return a.out_stride != 0 ? a.out_stride : static_cast<int64_t>(a.spec.num_q_heads) * a.spec.head_size;
}
inline int64_t key_row_stride(const AppendArgs& a) {
  return a.key_stride != 0 ? a.key_stride : static_cast<int64_t>(a.spec.num_kv_heads) * a.spec.head_size;
}
inline int64_t value_row_stride(const AppendArgs& a) {
  return a.value_stride != 0 ? a.value_stride : static_cast<int64_t>(a.spec.num_kv_heads) * a.spec.head_size;
}

}  // namespace decodegraph::detail
