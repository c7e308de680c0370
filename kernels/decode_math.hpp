// Math shared by the CUDA kernels and the host implementation (__host__ __device__):
// logits, online-softmax rescaling, state merging, the partition merge weights, and the index
// arithmetic of the paged layouts and the V2 partials. Keeping it in one place is what makes the
// host backend a faithful model of the device path.
//
// Conventions: m is a running max of logits (already scaled), l the sum of exp(s - m), acc the
// unnormalised sum of exp(s - m) * v. -inf marks "no token seen"; every function maps it to weight 0,
// never NaN.
#pragma once

#include <cmath>
#include <cstdint>

#include "decodegraph/numeric.hpp"
#include "decodegraph/types.hpp"

namespace decodegraph::math {

DG_HD float neg_inf() { return -INFINITY; }

/// exp(x - m) that is 0 when x is -inf (also when m is -inf, which then implies x is -inf).
DG_HD float exp_shifted(float x, float m) { return x == -INFINITY ? 0.0f : expf(x - m); }

/// Logit of one token: dot(q, k) * scale + alibi_slope * (pos - seq_len + 1).
DG_HD float logit(float dot, float scale, float alibi_slope, int pos, int seq_len) {
  return dot * scale + alibi_slope * static_cast<float>(pos - seq_len + 1);
}

/// Online softmax: folds a tile whose max logit is tile_max into (m, l).
/// Returns the factor by which the caller must rescale its accumulator; afterwards the caller adds
/// exp_shifted(s, m) for each of the tile's logits into l and acc.
DG_HD float online_rescale(float& m, float& l, float tile_max) {
  const float m_new = fmaxf(m, tile_max);
  const float f = exp_shifted(m, m_new);
  l *= f;
  m = m_new;
  return f;
}

/// Merging two online-softmax states a and b: the common max and each side's factor.
struct MergeFactors {
  float m;
  float fa;
  float fb;
};
DG_HD MergeFactors merge_factors(float ma, float mb) {
  const float m = fmaxf(ma, mb);
  return MergeFactors{m, exp_shifted(ma, m), exp_shifted(mb, m)};
}

// ---------------------------------------------------------------- base 2 (the pass-1 kernels)
// The pass-1 kernels keep logits multiplied by log2(e), so that every weight is one exp2: on the GPU
// ex2.approx.ftz.f32 (one MUFU.EX2; at most 2 ulp from the correctly rounded 2^x, subnormal results
// flushed to 0, 2^-inf = +0), on the host exp2f. Maxima convert back to natural logits (times ln 2)
// where they leave the kernel (the V2 partials). The host implementation (host_attention.cpp)
// uses the same steps with exp2f.

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

/// Base-2 logit of one token: dot * scale2 + bias2, with scale2 = scale * log2(e) and bias2 the
/// ALiBi term alibi_bias2 (0 without ALiBi). The kernels and the host form every logit with it.
DG_HD float logit2(float dot, float scale2, float bias2) { return dot * scale2 + bias2; }
/// ALiBi term of a token at `pos` in base 2: slope2 * (pos - seq_len + 1), slope2 = slope * log2(e).
DG_HD float alibi_bias2(float slope2, int pos, int seq_len) { return slope2 * static_cast<float>(pos - seq_len + 1); }

/// One online-softmax step in base 2: the running max after a tile whose max is tile_max, the
/// value the tile's weights subtract, `sub` (the max itself, or 0 while the row has seen nothing
/// but -inf: then every weight 2^(s - sub) and the rescale 2^(m_old - sub) are 0 (2^-inf), never
/// NaN (-inf - -inf): the one -inf guard per row and tile, instead of a select per weight), and
/// whether the max moved. Where it did not, the accumulators are not rescaled at all: ex2.approx
/// need not return exactly 1 for 2^0, and a factor 1 - 2 ulp applied every tile would shrink the
/// early tokens' weights against the late ones by 2 ulp per tile (1e-3 over 100K tokens).
struct MaxStep {
  float m;
  float sub;
  bool moved;
};
DG_HD MaxStep online_max2(float m_old, float tile_max) {
  const float m = fmaxf(m_old, tile_max);
  return MaxStep{m, m == -INFINITY ? 0.0f : m, m != m_old};
}

/// The tensor-core math's fp16 weights are scaled by 2^kTcWeightShiftFp16 (the weights subtract
/// m - 15 instead of m), so that they are <= 2^15 (fp16 max 65504) and even the lo parts of the
/// hi / lo split stay normal numbers down to weights of 2^-25 of the row's maximum. The scale
/// cancels in acc / l; exp sums leave the kernel unscaled. bf16 has fp32's range: no scale.
inline constexpr int kTcWeightShiftFp16 = 15;

// ---------------------------------------------------------------- fp8 caches (the tensor-core math)
// The kernels fold the dequantisation scales into the logit and the output (tensor_core_math.cuh):
// logit2 = q.k_code * scale2 with scale2 = fp8_scale2(...), output = acc / l * v_scale.

/// 2^s as a float, for s in [-126, 127].
DG_HD float pow2f(int s) { return bits_float(static_cast<uint32_t>(s + 127) << 23); }

/// bf16 q with an fp8 cache: the exponent s (in [-126, 126]) by which a q row whose largest
/// magnitude is amax is scaled before it converts to fp16, so that amax lands in [2^14, 2^15) (0
/// for an all-zero row; an inf or NaN row keeps its inf / NaN). The conversion is then exact for
/// every element above 2^-38 of amax (fp16's subnormals hold the rest to 2^-24 absolutely).
DG_HD int fp8_q_shift(float amax) {
  if (amax == 0.0f) return 0;
  const int e = static_cast<int>((float_bits(amax) >> 23) & 0xffu) - 127;  // floor(log2); -127: subnormal
  const int s = 14 - e;
  return s < -126 ? -126 : (s > 126 ? 126 : s);
}

/// The base-2 logit scale of an fp8 cache's row: scale * log2(e) * k_scale * unshift, unshift =
/// 2^-s of the row's q scaling (1 for fp16 q). The kernels and the host multiply in this order.
DG_HD float fp8_scale2(float scale, float k_scale, float unshift) { return scale * kLog2e * k_scale * unshift; }

/// 2^(x - m), 0 when x is -inf (the merge of the CUDA-core math's row slices, in exp2f).
DG_HD float exp2_shifted(float x, float m) { return x == -INFINITY ? 0.0f : exp2f(x - m); }

/// merge_factors for base-2 logits.
DG_HD MergeFactors merge_factors2(float ma, float mb) {
  const float m = fmaxf(ma, mb);
  return MergeFactors{m, exp2_shifted(ma, m), exp2_shifted(mb, m)};
}

// ---------------------------------------------------------------- sliding window, soft-cap, sinks

/// First position the query of a `len`-token sequence attends under a window of `window` tokens
/// (0: none): max(0, len - W), the query sitting at p = len - 1 and attending (p - W, p].
DG_HD int window_first(int len, int window) { return window > 0 && len > window ? len - window : 0; }
/// Where the kernels start reading: the first cache block of the window, as a position (a multiple
/// of block_size). Table entries and blocks before it are never touched; V2's partitions start here,
/// and the tokens of this block before window_first are masked one by one.
DG_HD int window_origin(int len, int window, int block_size) {
  // block_size is a power of two (kernels/common.cpp: 8, 16, 32): a mask, not a ~30-instruction division.
  return window > 0 ? window_first(len, window) & -block_size : 0;
}
/// The most tokens read (len - window_origin) by a sequence of at most max_len tokens: max_len
/// without a window, else min(max_len, W + block_size - 1). Sizes V2's partitions.
DG_HD int window_read_max(int max_len, int window, int block_size) {
  return window > 0 && window <= max_len - block_size ? window + block_size - 1 : max_len;
}

/// The window the reads of a q_len-row step cover: W + q_len - 1 (0 without a window). Row 0, at
/// position len - q_len, attends from len - q_len + 1 - W on, the earliest of the rows; so the reads
/// (window_origin, window_read_max, the block-table entries checked) use this window, and each row
/// masks its own first position, window_first(row_len(len, q_len, j), W).
DG_HD int read_window(int window, int q_len) { return window > 0 ? window + q_len - 1 : 0; }
/// Tokens row j of a q_len-row step of a `len`-token sequence sees: its query sits at len - q_len + j.
DG_HD int row_len(int len, int q_len, int j) { return len - q_len + 1 + j; }
/// DecodeParams::window_span of a window W: W - 1, or INT_MAX without one.
DG_HD uint32_t window_span(int window) { return window > 0 ? static_cast<uint32_t>(window - 1) : 0x7fffffffu; }
/// Whether a row whose query sits `rel` = pos - query positions from a token attends it: 0 >= rel
/// >= -(W - 1). rel > 0 (after the query) wraps -rel above INT_MAX, so one unsigned compare checks
/// the window and the causal end.
DG_HD bool attends(int rel, uint32_t span) { return static_cast<uint32_t>(-rel) <= span; }

/// Soft-cap of a base-2 logit: cap2 * tanh(s2 / cap2) with cap2 = c * log2(e) > 0, which is
/// c * tanh(s / c) in natural units times log2(e). Callers branch on cap2 > 0 (off: the logit as
/// it is), so a layer without a cap pays one uniform branch, never the tanh.
/// tanh(x) = 1 - 2 / (e^(2x) + 1) with e^(2x) = 2^(s2 * k2), k2 = softcap2_k(cap2) formed once per
/// launch: per logit one multiply, one exp2, one add, one reciprocal and one fma, instead of
/// tanhf's polynomial and branches. The kernels pass the hardware's approximate ex2 and rcp
/// (paged_decode.cuh, softcap2_dev: MUFU.EX2 at most 2 ulp, MUFU.RCP at most 1 ulp, both flushing
/// subnormals; the simulator models both at that worst), the host exp2f and a correctly rounded
/// 1 / x. The top saturates exactly (+cap2: 2^huge = inf, 1 / inf = 0), the bottom at -cap2 within
/// the bound (rcp(1) need not be exact). Error (docs/design.md,
/// "The bound per path"): at most ~6.5 u cap2 in base 2 (u = 2^-24), so each weight moves by up
/// to ~4.5 u c of itself (c the natural cap; rms ~3.2 u c): 1.3e-5 at c = 50, against 1.2e-7 for
/// ex2's 2 ulp.
DG_HD float softcap2_k(float cap2) { return cap2 > 0.0f ? 2.0f * kLog2e / cap2 : 0.0f; }
template <class Ex2, class Rcp>
DG_HD float softcap2(float s2, float cap2, float k2, Ex2 ex2, Rcp rcp) {
  return fmaf(-2.0f * cap2, rcp(ex2(s2 * k2) + 1.0f), cap2);
}
/// The host's soft-cap: the same formula with exp2f and 1 / x.
inline float softcap2(float s2, float cap2, float k2) {
  return softcap2(s2, cap2, k2, [](float x) { return exp2f(x); }, [](float x) { return 1.0f / x; });
}

/// A sink's term of a softmax denominator whose weights are 2^(s2 - sub) (base 2): 2^(sink log2(e) -
/// sub); 0 for sink = -inf (no sink). The sink is a raw natural logit (not scaled, not capped).
DG_HD float sink_weight2(float sink, float sub) { return exp2_shifted(sink * kLog2e, sub); }
/// The same for natural-log weights e^(s - M) (the V2 merge): e^(sink - M), 0 for sink = -inf.
DG_HD float sink_weight(float sink, float M) { return exp_shifted(sink, M); }

/// V1's sink, folded into a row whose running max is m (base 2) and whose weights are 2^(s - (m -
/// shift)): the softmax's max becomes max(m, sink log2(e)) (docs/design.md: m = max(sigma, max_t
/// s_t)), so the sink's term never overflows however far the sink lies above every logit. The row's
/// l and acc are scaled by f (exactly 1, and skipped, where the sink does not raise the max: the
/// bits of that case are those of adding the term alone), then l gains `term`.
struct SinkFold {
  float f;
  float term;
};
DG_HD SinkFold sink_fold2(float sink, float m, float shift) {
  const float s2 = sink * kLog2e;
  if (!(s2 > m)) return SinkFold{1.0f, exp2_shifted(s2, m - shift)};  // 0 for sink = -inf
  return SinkFold{exp2_shifted(m, s2), exp2f(shift)};
}
/// The V2 merge's max with the row's sink (-inf: none): M = max(sigma, max_p m_p), for the same reason.
DG_HD float merge_max(float M, float sink) { return fmaxf(M, sink); }

/// Pass 2 weight of a partition with max m_p and exp sum l_p, given the global max M:
/// w_p = l_p * exp(m_p - M); an empty partition (m_p = -inf) weighs 0.
DG_HD float partition_weight(float m_p, float l_p, float M) {
  return m_p == -INFINITY ? 0.0f : l_p * expf(m_p - M);
}

/// acc x (1 / l), or 0 where nothing was accumulated (l = 0). A NaN l (a row that attended a NaN
/// or infinite logit) gives NaN, never a finite number. A reciprocal, not acc / l: the compiler
/// forms 1 / l once per row, so an epilogue of 16 values per lane takes one IEEE reciprocal instead
/// of 16 divisions (issue 31); at most 1 ulp more rounding (l >= 1 wherever it is not 0: the row's
/// max contributes 2^0, so 1 / l never overflows).
DG_HD float normalise(float acc, float l) { return l != 0.0f ? acc * (1.0f / l) : 0.0f; }

/// Index of partition `part` of (seq, head) in the V2 max-logit / exp-sum arrays
/// [num_seqs, num_q_heads, max_partitions]; multiply by head_size for partial_out rows.
DG_HD int64_t partial_index(int seq, int q_head, int part, int num_q_heads, int max_partitions) {
  return (static_cast<int64_t>(seq) * num_q_heads + q_head) * max_partitions + part;
}

/// Element offset of K[block, kv_head, token-in-block, d] in the cache of one layer.
DG_HD int64_t k_offset(KVLayout layout, int64_t block, int kv_head, int tok, int d, int num_kv_heads,
                       int head_size, int block_size, int x) {
  if (layout == KVLayout::kNHD)
    return ((block * block_size + tok) * num_kv_heads + kv_head) * head_size + d;
  // [num_blocks, kv_heads, head_size/x, block_size, x]
  return (((block * num_kv_heads + kv_head) * (head_size / x) + d / x) * block_size + tok) * x + d % x;
}

/// Element offset of V[block, kv_head, token-in-block, d] in the cache of one layer.
DG_HD int64_t v_offset(KVLayout layout, int64_t block, int kv_head, int tok, int d, int num_kv_heads,
                       int head_size, int block_size) {
  if (layout == KVLayout::kNHD)
    return ((block * block_size + tok) * num_kv_heads + kv_head) * head_size + d;
  // [num_blocks, kv_heads, head_size, block_size]
  return ((block * num_kv_heads + kv_head) * head_size + d) * block_size + tok;
}

/// x of the vLLM K layout: elements per 16 bytes.
DG_HD int vllm_x(int elem_bytes) { return 16 / elem_bytes; }

}  // namespace decodegraph::math
