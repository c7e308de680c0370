// Argument validation for the eager entry points (attention.hpp) and the V2 workspace layout.
// Everything here is host-only and reads only host memory: device pointers are checked for null and
// alignment, never dereferenced; contents are checked only through the optional host_* copies.
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "kernels/append_report.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/validate.hpp"

namespace decodegraph {
namespace {

// q/out/K/V are read with 16-byte vector loads by the kernels.
constexpr std::uintptr_t kTensorAlign = 16;
constexpr std::size_t kWorkspaceAlign = 256;

std::string ptr_text(const void* p) {
  if (p == nullptr) return "null";
  return detail::to_text(p);
}

void require_ptr(const void* p, std::string_view name, std::uintptr_t align) {
  const std::string allowed =
      "a non-null pointer aligned to " + std::to_string(align) + " bytes";
  require(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % align == 0, name, ptr_text(p),
          allowed);
}

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// A row stride (elements between consecutive rows): 0 (contiguous) or at least one row of `row`
// elements and a multiple of 16 bytes (the kernels move rows in 16-byte chunks).
void require_row_stride(int64_t stride, std::string_view name, int64_t row, std::size_t elem_bytes) {
  const int64_t per_chunk = static_cast<int64_t>(16 / elem_bytes);
  require(stride == 0 || (stride >= row && stride % per_chunk == 0), name, stride,
          "0 (contiguous) or a multiple of " + std::to_string(per_chunk) + " elements (16 bytes) that is >= " +
              std::to_string(row) + " (one row)");
}

// fp8 caches need both scales (fp32, read by the kernels); kv_dtype auto ignores them.
void require_scales(const AttentionSpec& s, const float* k_scale, const float* v_scale) {
  if (!s.fp8_kv()) return;
  for (auto [p, name] : {std::pair{k_scale, "k_scale"}, std::pair{v_scale, "v_scale"}}) {
    if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0) continue;  // no text built
    require(false, name, ptr_text(p),
            "a non-null pointer aligned to 4 bytes to " + std::to_string(s.kv_scale_count()) +
                " fp32 value(s) (required with kv_dtype " + to_string(s.kv_dtype) + ")");
  }
}

}  // namespace

void detail::check_host_scales(const AttentionSpec& s, const float* k_scale, const float* v_scale) {
  if (!s.fp8_kv()) return;
  for (auto [p, name] : {std::pair{k_scale, "k_scale"}, std::pair{v_scale, "v_scale"}})
    for (int h = 0; h < s.kv_scale_count(); ++h)
      if (!(std::isfinite(p[h]) && p[h] > 0.0f))  // the name is built only for the error (every host step)
        require(false, std::string(name) + "[" + std::to_string(h) + "]", p[h],
                "a finite value > 0 (K = code * k_scale, V = code * v_scale)");
}

void detail::check_host_sinks(const AttentionSpec& s, const float* sinks) {
  if (sinks == nullptr) return;
  for (int h = 0; h < s.num_q_heads; ++h)
    require(!std::isnan(sinks[h]) && sinks[h] != INFINITY, "sinks[" + std::to_string(h) + "]", sinks[h],
            "a finite raw logit or -inf (no sink for that head)");
}

void validate_partition_size(const AttentionSpec& spec, int partition_size) {
  require(partition_size > 0 && spec.block_size > 0 && partition_size % spec.block_size == 0,
          "partition_size", partition_size,
          "a positive multiple of block_size = " + std::to_string(spec.block_size));
}

void validate_decode_args(const DecodeArgs& a) {
  validate_spec(a.spec);
  const AttentionSpec& s = a.spec;
  // Pass 1's grid z is the sequences (at most 65535 blocks): checked here, before anything launches.
  require(a.num_seqs > 0 && a.num_seqs <= kMaxSeqsPerLaunch, "num_seqs", a.num_seqs,
          "a positive integer up to " + std::to_string(kMaxSeqsPerLaunch) + " per launch (the kernels' grid z)");
  require(a.q_len >= 1 && a.q_len <= kMaxQLen, "q_len", a.q_len, "1 .. kMaxQLen = 1 .. " + std::to_string(kMaxQLen));
  require(a.max_seq_len > 0, "max_seq_len", a.max_seq_len, "a positive integer");
  require(a.num_blocks > 0, "num_blocks", a.num_blocks, "a positive integer");
  require(a.block_table_stride > 0 &&
              static_cast<int64_t>(a.block_table_stride) * s.block_size >= a.max_seq_len,
          "block_table_stride", a.block_table_stride,
          "at least ceil(max_seq_len / block_size) = ceil(" + std::to_string(a.max_seq_len) +
              " / " + std::to_string(s.block_size) + ") = " +
              std::to_string((a.max_seq_len + s.block_size - 1) / s.block_size));

  const std::size_t esz = dtype_size(s.dtype);
  require_row_stride(a.q_stride, "q_stride", static_cast<int64_t>(s.num_q_heads) * s.head_size, esz);
  require_row_stride(a.out_stride, "out_stride", static_cast<int64_t>(s.num_q_heads) * s.head_size, esz);
  require_ptr(a.q, "q", kTensorAlign);
  require_ptr(a.out, "out", kTensorAlign);
  require_ptr(a.k_cache, "k_cache", kTensorAlign);
  require_ptr(a.v_cache, "v_cache", kTensorAlign);
  require_ptr(a.block_tables, "block_tables", alignof(int32_t));
  require_ptr(a.seq_lens, "seq_lens", alignof(int32_t));
  if (a.alibi_slopes != nullptr) require_ptr(a.alibi_slopes, "alibi_slopes", alignof(float));
  if (a.sinks != nullptr) require_ptr(a.sinks, "sinks", alignof(float));
  require_scales(s, a.k_scale, a.v_scale);

  if (a.bad_block != nullptr) require_ptr(a.bad_block, "bad_block", alignof(int));

  if (a.host_seq_lens != nullptr) {
    // 0 marks a padded row (accepted everywhere; its output is left untouched).
    const std::string allowed = "0 (padded row) .. max_seq_len = 0 .. " + std::to_string(a.max_seq_len);
    for (int i = 0; i < a.num_seqs; ++i) {
      const int32_t len = a.host_seq_lens[i];
      require(len >= 0 && len <= a.max_seq_len, "seq_lens[" + std::to_string(i) + "]", len,
              allowed);
      // The step's q_len tokens are in the cache: a sequence holds at least them.
      if (len > 0 && len < a.q_len)
        require(false, "seq_lens[" + std::to_string(i) + "]", len,
                "0 (padded row) or at least q_len = " + std::to_string(a.q_len));
    }
  }
  if (a.host_block_tables != nullptr) {
    // Only the entries a length uses (a window's from its first block on: those before it may hold
    // any id); without host lengths, those max_seq_len would use.
    const std::string allowed = "0 .. num_blocks - 1 = 0 .. " + std::to_string(a.num_blocks - 1);
    for (int i = 0; i < a.num_seqs; ++i) {
      const int len = a.host_seq_lens != nullptr ? a.host_seq_lens[i] : a.max_seq_len;
      const int used = num_partitions(len, s.block_size);
      const int32_t* row = a.host_block_tables + static_cast<int64_t>(i) * a.block_table_stride;
      const int win = math::read_window(s.sliding_window, a.q_len);
      for (int j = math::window_origin(len, win, s.block_size) / s.block_size; j < used; ++j) {
        require(row[j] >= 0 && row[j] < a.num_blocks,
                "block_tables[" + std::to_string(i) + "][" + std::to_string(j) + "]", row[j],
                allowed);
      }
    }
  }
}

V2WorkspaceLayout v2_workspace_layout(const AttentionSpec& spec, int num_seqs, int max_seq_len,
                                      int partition_size, int q_len) {
  validate_spec(spec);
  require(num_seqs > 0, "num_seqs", num_seqs, "a positive integer");
  require(max_seq_len > 0, "max_seq_len", max_seq_len, "a positive integer");
  require(q_len >= 1 && q_len <= kMaxQLen, "q_len", q_len, "1 .. kMaxQLen = 1 .. " + std::to_string(kMaxQLen));
  validate_partition_size(spec, partition_size);
  V2WorkspaceLayout w;
  w.max_partitions = num_partitions(
      math::window_read_max(max_seq_len, math::read_window(spec.sliding_window, q_len), spec.block_size),
      partition_size);
  const std::size_t rows = static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(q_len) *
                           static_cast<std::size_t>(spec.num_q_heads) *
                           static_cast<std::size_t>(w.max_partitions);
  w.max_logits_offset = 0;
  w.exp_sums_offset = round_up(rows * sizeof(float), kWorkspaceAlign);
  w.partial_out_offset = w.exp_sums_offset + round_up(rows * sizeof(float), kWorkspaceAlign);
  w.total_bytes = w.partial_out_offset +
                  round_up(rows * static_cast<std::size_t>(spec.head_size) * sizeof(float),
                           kWorkspaceAlign);
  return w;
}

std::size_t v2_workspace_size(const AttentionSpec& spec, int num_seqs, int max_seq_len,
                              int partition_size, int q_len) {
  return v2_workspace_layout(spec, num_seqs, max_seq_len, partition_size, q_len).total_bytes;
}

V2WorkspaceLayout detail::validate_v2_args(const DecodeArgs& args, int partition_size,
                                           const void* workspace, std::size_t workspace_bytes) {
  validate_decode_args(args);
  validate_partition_size(args.spec, partition_size);
  const V2WorkspaceLayout w =
      v2_workspace_layout(args.spec, args.num_seqs, args.max_seq_len, partition_size, args.q_len);
  // The merge's grid x is rows x heads (kernels/merge_partitions.cuh).
  const int64_t merge_blocks = static_cast<int64_t>(args.num_seqs) * args.q_len * args.spec.num_q_heads;
  require(merge_blocks <= INT_MAX, "num_seqs", args.num_seqs,
          "num_seqs x q_len x num_q_heads at most 2^31 - 1 (the merge's grid x; here " +
              std::to_string(merge_blocks) + ")");
  require_ptr(workspace, "workspace", kTensorAlign);
  require(workspace_bytes >= w.total_bytes, "workspace_bytes", workspace_bytes,
          "at least v2_workspace_size(...) = " + std::to_string(w.total_bytes));
  return w;
}

void detail::require_position_slot(const std::string& param, int64_t slot, int len, const int32_t* row,
                                   int block_table_stride, int block_size, int num_blocks,
                                   const std::string& row_name, const std::string& position) {
  const std::string counts = position == "seq_len - 1" ? "the token" : "every token";
  if (len >= 1 && (len - 1) / block_size < block_table_stride) {
    const int col = (len - 1) / block_size;
    require(row[col] >= 0 && row[col] < num_blocks, row_name + "[" + std::to_string(col) + "]", row[col],
            "0..num_blocks-1 = 0.." + std::to_string(num_blocks - 1) + " (the block of position " + position +
                " = " + std::to_string(len - 1) + ", where " + param + " = " + std::to_string(slot) + " goes)");
  }
  const int64_t want = kernels::position_slot(len, row, block_table_stride, block_size);
  if (slot == want) return;
  if (want < 0)
    throw_invalid(param, slot,
                  "negative (skip): its sequence has no position " + position + " = " + std::to_string(len - 1) +
                      " within its block-table row of " + std::to_string(block_table_stride) + " entries");
  const int pos = len - 1, col = pos / block_size, off = pos % block_size;
  throw_invalid(param, slot,
                "negative (skip) or the slot of position " + position + " = " + std::to_string(pos) +
                    " (seq_lens counts " + counts + " appended this step): " + row_name + "[" + std::to_string(col) +
                    "] * block_size + " + std::to_string(off) + " = " + std::to_string(row[col]) + " * " +
                    std::to_string(block_size) + " + " + std::to_string(off) + " = " + std::to_string(want));
}

bool detail::position_slot_ok(int64_t slot, int len, const int32_t* row, int block_table_stride, int block_size,
                              int num_blocks) {
  if (len >= 1 && (len - 1) / block_size < block_table_stride) {
    const int32_t id = row[(len - 1) / block_size];
    if (id < 0 || id >= num_blocks) return false;
  }
  return slot == kernels::position_slot(len, row, block_table_stride, block_size);
}

void validate_append_args(const AppendArgs& a) {
  validate_spec(a.spec);
  require(a.num_tokens > 0, "num_tokens", a.num_tokens, "a positive integer");
  require(a.num_blocks > 0, "num_blocks", a.num_blocks, "a positive integer");
  const int64_t row = static_cast<int64_t>(a.spec.num_kv_heads) * a.spec.head_size;
  require_row_stride(a.key_stride, "key_stride", row, dtype_size(a.spec.dtype));
  require_row_stride(a.value_stride, "value_stride", row, dtype_size(a.spec.dtype));
  require_ptr(a.key, "key", kTensorAlign);
  require_ptr(a.value, "value", kTensorAlign);
  require_ptr(a.k_cache, "k_cache", kTensorAlign);
  require_ptr(a.v_cache, "v_cache", kTensorAlign);
  require_ptr(a.slot_mapping, "slot_mapping", alignof(int64_t));
  require_scales(a.spec, a.k_scale, a.v_scale);
  require((a.seq_lens == nullptr) == (a.block_tables == nullptr), "block_tables",
          ptr_text(a.block_tables),
          std::string("null with seq_lens null, non-null with seq_lens given (seq_lens = ") + ptr_text(a.seq_lens) +
              "): the slot check needs both");
  require(a.tokens_per_seq >= 1 && a.tokens_per_seq <= kMaxQLen, "tokens_per_seq", a.tokens_per_seq,
          "1 .. kMaxQLen = 1 .. " + std::to_string(kMaxQLen) + " consecutive tokens per sequence");
  if (a.block_tables != nullptr) {
    require_ptr(a.seq_lens, "seq_lens", alignof(int32_t));
    require_ptr(a.block_tables, "block_tables", alignof(int32_t));
    require(a.block_table_stride > 0, "block_table_stride", a.block_table_stride,
            "a positive integer with block_tables given");
    require(a.num_tokens % a.tokens_per_seq == 0, "num_tokens", a.num_tokens,
            "a multiple of tokens_per_seq = " + std::to_string(a.tokens_per_seq) +
                " with seq_lens given (num_tokens / tokens_per_seq sequences of tokens_per_seq tokens each)");
  }
  if (a.bad_slot != nullptr) {
    require_ptr(a.bad_slot, "bad_slot", alignof(int));
    // Report codes are -(2 * token + kind): they must fit an int.
    require(a.num_tokens <= (1 << 30), "num_tokens", a.num_tokens, "at most 2^30 with bad_slot given");
  }
  if (a.host_slot_mapping != nullptr) {
    const int64_t num_slots = static_cast<int64_t>(a.num_blocks) * a.spec.block_size;
    const std::string allowed = "a negative value (skipped) or 0 .. num_blocks * block_size - 1 = 0 .. " +
                                std::to_string(num_slots - 1);
    for (int i = 0; i < a.num_tokens; ++i) {
      require(a.host_slot_mapping[i] < num_slots, "slot_mapping[" + std::to_string(i) + "]",
              a.host_slot_mapping[i], allowed);
    }
  }
}

}  // namespace decodegraph
