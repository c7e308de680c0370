// Host implementation of the KV append (vLLM reshape_and_cache): scatters key/value
// [num_tokens, kv_heads, head_size] into the paged caches at slot = block * block_size + offset,
// using the same layout offsets as the kernels (decode_math.hpp). Elements are copied bit for bit
// (the caches share the dtype of key/value). Negative slots are skipped.
#include <cstdint>
#include <cstring>
#include <string>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "kernels/decode_math.hpp"

namespace decodegraph::host {

void append_kv(const AppendArgs& args) {
  validate_append_args(args);
  const AttentionSpec& s = args.spec;
  const int hs = s.head_size, bs = s.block_size, H = s.num_kv_heads;
  const std::size_t esz = dtype_size(s.dtype);
  const int x = math::vllm_x(static_cast<int>(esz));
  const int64_t num_slots = static_cast<int64_t>(args.num_blocks) * bs;

  // slot_mapping is host memory here: check every slot before writing anything.
  for (int t = 0; t < args.num_tokens; ++t)
    require(args.slot_mapping[t] < num_slots, "slot_mapping[" + std::to_string(t) + "]",
            args.slot_mapping[t],
            "a negative value (skipped) or 0 .. num_blocks * block_size - 1 = 0 .. " +
                std::to_string(num_slots - 1));

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
      const int64_t src = (static_cast<int64_t>(t) * H + h) * hs;
      for (int d = 0; d < hs; ++d) {
        const int64_t ko = math::k_offset(s.layout, block, h, off, d, H, hs, bs, x);
        const int64_t vo = math::v_offset(s.layout, block, h, off, d, H, hs, bs);
        std::memcpy(kc + ko * esz, key + (src + d) * esz, esz);
        std::memcpy(vc + vo * esz, value + (src + d) * esz, esz);
      }
    }
  }
}

}  // namespace decodegraph::host
