// Host implementation of the KV append (vLLM reshape_and_cache): scatters key/value token rows
// ([kv_heads, head_size], key_stride / value_stride elements apart) into the paged caches at slot = block * block_size + offset,
// using the same layout offsets as the kernels (decode_math.hpp). Elements are copied bit for bit
// when the caches share the dtype of key/value; fp8 caches store the code of x / scale (fp32
// division, then numeric.hpp's rounding to nearest even, saturated: the device append's function).
// Negative slots are skipped. Every slot is checked before anything is written: against the cache,
// and with seq_lens / block_tables against its position in its sequence (seq_len - 1, or
// seq_len - tokens_per_seq + j for token j of a group; kernels/append_report.hpp; the kernel skips
// and reports instead).
#include <cstdint>
#include <cstring>
#include <string>

#include "decodegraph/attention.hpp"
#include "decodegraph/numeric.hpp"
#include "kernels/append_report.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/validate.hpp"

namespace decodegraph::host {

void append_kv(const AppendArgs& args) {
  // slot_mapping is host memory here: validation checks every slot before anything is written.
  AppendArgs checked = args;
  checked.host_slot_mapping = args.slot_mapping;
  validate_append_args(checked);
  if (args.block_tables != nullptr) {
    const int n = args.tokens_per_seq;
    for (int t = 0; t < args.num_tokens; ++t) {
      // Token j of sequence i, at position seq_lens[i] - n + j (append_report.hpp).
      const int i = t / n, j = t % n;
      const int32_t* tr = args.block_tables + static_cast<int64_t>(i) * args.block_table_stride;
      const int len = kernels::token_position_len(args.seq_lens[i], n, j);
      if (args.slot_mapping[t] < 0 ||
          detail::position_slot_ok(args.slot_mapping[t], len, tr, args.block_table_stride, args.spec.block_size,
                                   args.num_blocks))
        continue;
      std::string param = "slot_mapping[" + std::to_string(t) + "]";
      std::string position = "seq_len - 1";
      if (n > 1) {
        position = "seq_len - tokens_per_seq + " + std::to_string(j);
        param += " (sequence " + std::to_string(i) + ", token " + std::to_string(j) + " of tokens_per_seq " +
                 std::to_string(n) + ")";
      }
      detail::require_position_slot(param, args.slot_mapping[t], len, tr, args.block_table_stride,
                                    args.spec.block_size, args.num_blocks, "block_tables[" + std::to_string(i) + "]",
                                    position);
    }
  }
  const AttentionSpec& s = args.spec;
  detail::check_host_scales(s, args.k_scale, args.v_scale);
  const int hs = s.head_size, bs = s.block_size, H = s.num_kv_heads;
  const std::size_t esz = dtype_size(s.dtype);
  const std::size_t csz = s.kv_elem_size();
  const int x = math::vllm_x(static_cast<int>(csz));
  const int64_t key_stride = detail::key_row_stride(args);
  const int64_t value_stride = detail::value_row_stride(args);

  const auto* key = static_cast<const unsigned char*>(args.key);
  const auto* value = static_cast<const unsigned char*>(args.value);
  auto* kc = static_cast<unsigned char*>(args.k_cache);
  auto* vc = static_cast<unsigned char*>(args.v_cache);
  for (int t = 0; t < args.num_tokens; ++t) {
    const int64_t slot = args.slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / bs;
    const int off = static_cast<int>(slot % bs);
    for (int h = 0; h < H; ++h) {
      const int64_t ksrc = t * key_stride + static_cast<int64_t>(h) * hs;
      const int64_t vsrc = t * value_stride + static_cast<int64_t>(h) * hs;
      const int si = s.kv_scale_per_head ? h : 0;
      for (int d = 0; d < hs; ++d) {
        const int64_t ko = math::k_offset(s.layout, block, h, off, d, H, hs, bs, x);
        const int64_t vo = math::v_offset(s.layout, block, h, off, d, H, hs, bs);
        if (s.fp8_kv()) {
          kc[ko] = float_to_fp8_bits(s.kv_dtype, load_as_float(s.dtype, args.key, ksrc + d) / args.k_scale[si]);
          vc[vo] = float_to_fp8_bits(s.kv_dtype, load_as_float(s.dtype, args.value, vsrc + d) / args.v_scale[si]);
          continue;
        }
        std::memcpy(kc + ko * csz, key + (ksrc + d) * esz, esz);
        std::memcpy(vc + vo * csz, value + (vsrc + d) * esz, esz);
      }
    }
  }
}

}  // namespace decodegraph::host
