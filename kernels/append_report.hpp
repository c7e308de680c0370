// The KV append's slot check (__host__ __device__, shared by the append kernel, the host append and
// the host backend) and the code it reports through a device int.
//
// A token's slot must be the slot of its position under its sequence's block-table row (seq_lens
// count the tokens appended this step): with n = tokens_per_seq tokens per sequence (q_len), token t
// is token j = t % n of sequence i = t / n, at position p = seq_lens[i] - n + j (n = 1: seq_len - 1),
// slot block_tables[i][p / bs] * bs + p % bs.
// A slot past the cache (>= num_blocks * block_size) is never written. The codes follow the pass-1
// kernels' bad-block flag (attention.hpp DecodeArgs::bad_block), so one int carries both: positive,
// a block-table entry outside [0, num_blocks) (flat index + 1, INT_MAX past that); negative, a
// slot mistake, -(2 * token + kind). The first report wins (atomicCAS from 0), whichever kind.
#pragma once

#include <climits>
#include <cstdint>

#include "decodegraph/numeric.hpp"  // DG_HD
#include "kernels/decode_math.hpp"

namespace decodegraph::kernels {

/// The two slot mistakes of a negative code.
enum class AppendReport : int {
  kSlotMismatch = 1,   // not the slot of its position seq_len - n + j under the row (or no such position)
  kSlotPastCache = 2,  // slot >= num_blocks * block_size
};

/// The slot of position len - 1 under `row` (block_table_stride entries), or -1 when there is no
/// such position: len < 1, or a column past the row. The block id is not checked here.
DG_HD int64_t position_slot(int len, const int32_t* row, int block_table_stride, int block_size) {
  if (len < 1) return -1;
  const int pos = len - 1;
  const int col = pos / block_size;
  if (col >= block_table_stride) return -1;
  return static_cast<int64_t>(row[col]) * block_size + pos % block_size;
}

/// The length whose last position is token j's of n new tokens in a sequence of seq_len (counting
/// them): math::row_len (n = 1: seq_len). Below 1: no such position. seq_len is clamped far below 0
/// first, so that garbage lengths (unchecked under kCheap) cannot overflow.
DG_HD int token_position_len(int seq_len, int n, int j) {
  return math::row_len(seq_len < -(1 << 30) ? -(1 << 30) : seq_len, n, j);
}

/// The code of a slot mistake: -(2 * token + kind), always negative.
DG_HD int append_report_code(int token, AppendReport kind) { return -(2 * token + static_cast<int>(kind)); }
/// Decoding a negative code.
DG_HD AppendReport append_report_kind(int code) { return static_cast<AppendReport>((-code - 1) % 2 + 1); }
DG_HD int append_report_token(int code) { return (-code - 1) / 2; }

/// Checks token `token`'s slot (>= 0; negative slots are padding and never checked). Returns 0 when
/// it may be written, else the code to report (the token is then skipped): a bad block id at the
/// position's table entry first (the root cause, reported as the attention would: the flat index of
/// that entry in the sequence's row, (token / n) * block_table_stride + column, + 1), then a slot past
/// the cache, then a slot that is not the position's. seq_lens / block_tables (one row per sequence
/// of tokens_per_seq = n consecutive tokens) null: only the cache bound.
DG_HD int check_append_slot(int64_t slot, int num_blocks, const int32_t* seq_lens, const int32_t* block_tables,
                            int block_table_stride, int block_size, int token, int tokens_per_seq = 1) {
  const int64_t num_slots = static_cast<int64_t>(num_blocks) * block_size;
  if (seq_lens == nullptr || block_tables == nullptr)
    return slot >= num_slots ? append_report_code(token, AppendReport::kSlotPastCache) : 0;
  const int seq = token / tokens_per_seq;
  const int32_t* row = block_tables + static_cast<int64_t>(seq) * block_table_stride;
  const int len = token_position_len(seq_lens[seq], tokens_per_seq, token % tokens_per_seq);
  const int col = len >= 1 ? (len - 1) / block_size : 0;
  if (len >= 1 && col < block_table_stride && (row[col] < 0 || row[col] >= num_blocks)) {
    const int64_t flat = static_cast<int64_t>(seq) * block_table_stride + col + 1;
    return flat < INT_MAX ? static_cast<int>(flat) : INT_MAX;
  }
  if (slot >= num_slots) return append_report_code(token, AppendReport::kSlotPastCache);
  return position_slot(len, row, block_table_stride, block_size) == slot
             ? 0
             : append_report_code(token, AppendReport::kSlotMismatch);
}

}  // namespace decodegraph::kernels
