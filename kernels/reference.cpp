// float64 reference for paged decode attention: plain loops, written from the shapes documented in
// attention.hpp / types.hpp only. Deliberately shares nothing with the code under test
// (no decode_math.hpp, no host implementation): it is the yardstick for both.
//
// For each (sequence, query head): gather K/V token by token through the block table, logits
// s_t = scale * q.k_t + slope * (t - len + 1), soft-capped s_t -> c * tanh(s_t / c) when c > 0, over
// t in (len - 1 - W, len - 1] with a sliding window W (else every t < len); softmax in double with
// max subtraction, the sink sigma (raw) in the max and the denominator only: out = sum p_t v_t.
// Block-table entries and blocks holding no attended position are never read.
// q_len n > 1: row j of a sequence of L tokens is the single-token case at length L - n + 1 + j
// (its query at position L - n + j, ALiBi relative to it), q and out rows s * n + j.
// fp8 caches: k = value(code) * k_scale, v = value(code) * v_scale in double, the code's value
// spelled out from its bit fields here (types.hpp's formats).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/numeric.hpp"
#include "kernels/fp8_fields.hpp"
#include "kernels/validate.hpp"

namespace decodegraph::reference {
namespace {

// Strides (in elements) of the four-or-five-dimensional caches, spelled out per layout.
struct CacheIndex {
  KVLayout layout;
  int64_t heads, hs, bs, x;

  // K vLLM: [num_blocks, kv_heads, head_size/x, block_size, x]; NHD: [num_blocks, block_size, kv_heads, head_size]
  int64_t k(int64_t block, int64_t head, int64_t tok, int64_t d) const {
    if (layout == KVLayout::kVLLM) {
      const int64_t s4 = 1, s3 = x, s2 = bs * x, s1 = (hs / x) * bs * x, s0 = heads * s1;
      return block * s0 + head * s1 + (d / x) * s2 + tok * s3 + (d % x) * s4;
    }
    return nhd(block, head, tok, d);
  }
  // V vLLM: [num_blocks, kv_heads, head_size, block_size]; NHD as K
  int64_t v(int64_t block, int64_t head, int64_t tok, int64_t d) const {
    if (layout == KVLayout::kVLLM) {
      const int64_t s3 = 1, s2 = bs, s1 = hs * bs, s0 = heads * s1;
      return block * s0 + head * s1 + d * s2 + tok * s3;
    }
    return nhd(block, head, tok, d);
  }
  int64_t nhd(int64_t block, int64_t head, int64_t tok, int64_t d) const {
    const int64_t s3 = 1, s2 = hs, s1 = heads * hs, s0 = bs * s1;
    return block * s0 + tok * s1 + head * s2 + d * s3;
  }
};

// Element i of a cache: the model dtype's value, or an fp8 code's value times its scale.
double cache_value(const AttentionSpec& s, const void* cache, int64_t i, const float* scale, int kv_head) {
  if (s.kv_dtype == KVCacheDType::kAuto) return load_as_float(s.dtype, cache, static_cast<std::size_t>(i));
  const double sc = scale[s.kv_scale_per_head ? kv_head : 0];
  return detail::fp8_value(s.kv_dtype, static_cast<const uint8_t*>(cache)[i]) * sc;
}

}  // namespace

void paged_attention(const DecodeArgs& args, double* out64) {
  // The reference writes out64, never args.out, so args.out may be null here.
  DecodeArgs checked = args;
  if (checked.out == nullptr) checked.out = const_cast<void*>(args.q);
  validate_decode_args(checked);
  require(out64 != nullptr, "out64", "null", "a non-null pointer");
  const AttentionSpec& s = args.spec;
  const int hs = s.head_size, bs = s.block_size;
  const int group = s.num_q_heads / s.num_kv_heads;
  const double scale = s.scale > 0.0f ? static_cast<double>(s.scale) : 1.0 / std::sqrt(double(hs));
  const CacheIndex ci{s.layout, s.num_kv_heads, hs, bs, static_cast<int64_t>(16 / s.kv_elem_size())};
  detail::check_host_scales(s, args.k_scale, args.v_scale);

  const int n = args.q_len;
  for (int seq = 0; seq < args.num_seqs; ++seq) {
    const int seq_len = args.seq_lens[seq];
    require(seq_len >= 0 && seq_len <= args.max_seq_len, "seq_lens[" + std::to_string(seq) + "]", seq_len,
            "0 .. max_seq_len = 0 .. " + std::to_string(args.max_seq_len));
    if (seq_len == 0) continue;  // padded row: output untouched
    require(seq_len >= n, "seq_lens[" + std::to_string(seq) + "]", seq_len,
            "at least q_len = " + std::to_string(n) + " (the step's query tokens are in the cache)");
    for (int r = 0; r < n; ++r) {
    // Row r: the query at position seq_len - n + r sees len = seq_len - n + 1 + r tokens.
    const int len = seq_len - n + 1 + r;
    const int64_t qrow = static_cast<int64_t>(seq) * n + r;
    const int32_t* table = args.block_tables + static_cast<int64_t>(seq) * args.block_table_stride;
    // Attended positions [first, len): the window (len - 1 - W, len - 1], or all of them.
    const int first = s.sliding_window > 0 && len > s.sliding_window ? len - s.sliding_window : 0;
    for (int j = first / bs; j < (len + bs - 1) / bs; ++j)
      require(table[j] >= 0 && table[j] < args.num_blocks,
              "block_tables[" + std::to_string(seq) + "][" + std::to_string(j) + "]", table[j],
              "0 .. num_blocks - 1 = 0 .. " + std::to_string(args.num_blocks - 1));

    std::vector<double> q(hs), logits(len);
    for (int h = 0; h < s.num_q_heads; ++h) {
      const int kvh = h / group;
      // q: row `qrow` starts q_stride elements after row qrow - 1 (0: rows packed), heads contiguous.
      const int64_t q_row = args.q_stride != 0 ? args.q_stride : int64_t{s.num_q_heads} * hs;
      for (int d = 0; d < hs; ++d) q[d] = load_as_float(s.dtype, args.q, qrow * q_row + int64_t{h} * hs + d);
      const int64_t row = (qrow * s.num_q_heads + h) * hs;  // of out64 (packed)
      const double slope = args.alibi_slopes ? double(args.alibi_slopes[h]) : 0.0;
      const double cap = s.logit_softcap;
      const double sink = args.sinks ? double(args.sinks[h]) : -INFINITY;
      require(!std::isnan(sink) && sink != INFINITY, "sinks[" + std::to_string(h) + "]", sink,
              "a finite raw logit or -inf (no sink for that head)");

      double mx = sink;  // -inf without a sink
      for (int t = first; t < len; ++t) {
        const int64_t block = table[t / bs];
        double dot = 0.0;
        for (int d = 0; d < hs; ++d)
          dot += q[d] * cache_value(s, args.k_cache, ci.k(block, kvh, t % bs, d), args.k_scale, kvh);
        double x = dot * scale + slope * double(t - len + 1);
        if (cap > 0.0) x = cap * std::tanh(x / cap);
        logits[t] = x;
        mx = std::max(mx, logits[t]);
      }
      double sum = sink == -INFINITY ? 0.0 : std::exp(sink - mx);
      for (int t = first; t < len; ++t) {
        logits[t] = std::exp(logits[t] - mx);
        sum += logits[t];
      }
      double* o = out64 + row;
      std::fill(o, o + hs, 0.0);
      for (int t = first; t < len; ++t) {
        const int64_t block = table[t / bs];
        const double p = logits[t] / sum;
        for (int d = 0; d < hs; ++d)
          o[d] += p * cache_value(s, args.v_cache, ci.v(block, kvh, t % bs, d), args.v_scale, kvh);
      }
    }
    }
  }
}

}  // namespace decodegraph::reference
