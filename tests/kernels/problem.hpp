// Builds one random paged-attention problem on the host: q, K/V caches filled with random values,
// random block tables (repeated ids allowed unless asked otherwise), NaN-poisoned output, and the
// float64 reference. Used by the host attention tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/numeric.hpp"
#include "kernels/decode_math.hpp"
#include "test_util.hpp"

namespace dgtest {

using decodegraph::AttentionSpec;
using decodegraph::DecodeArgs;
using decodegraph::KVLayout;

/// A spec of the given dtype, head size, block size, layout and head counts (the rest default).
inline AttentionSpec make_spec(decodegraph::DType dtype, int head_size, int block_size, KVLayout layout, int q_heads,
                               int kv_heads) {
  AttentionSpec s;
  s.dtype = dtype;
  s.head_size = head_size;
  s.block_size = block_size;
  s.layout = layout;
  s.num_q_heads = q_heads;
  s.num_kv_heads = kv_heads;
  return s;
}

/// Tolerances |out - ref| <= atol + rtol * |ref| against the float64 reference. The numerical
/// contract (docs/design.md, tests/kernels/numerics.hpp) bounds the kernels' own error per element;
/// these are its consequence for the tests' inputs (|q|, |k|, |v| <= 1, up to ~100K tokens):
///   rtol: the output's own rounding, half an ulp of the dtype relative to the value (2^-8 bf16,
///         2^-11 fp16), with 1 % slack; fp32 outputs add no rounding worth counting;
///   atol: the kernel's error and outputs near 0. The precise path keeps it at ~1e-6 of the values
///         under the simulator (sim_numerics_test.cpp); the bounds below leave a factor 50-100 for
///         what the simulator does not model (the tensor cores' own accumulation, 100K tokens).
/// Before the hi / lo weights (issue 23) fp16 / bf16 needed 1e-3 / 2e-3 and 8e-3 / 1.6e-2: the
/// rounded weights' error is ~1e-4 of the values at 1300 tokens, so a kernel that rounds P again
/// fails the atol below (and the correctly rounded share, numerics.hpp).
struct Tolerance {
  double atol, rtol;
};
inline double rounding_rtol(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 0.0;
    case DType::kFloat16: return 1.01 * 4.8828125e-4;   // 2^-11
    case DType::kBFloat16: return 1.01 * 3.90625e-3;    // 2^-8
  }
  return 0;
}
/// The host implementation (kernels/host_attention.cpp, the same math per path as the device).
inline Tolerance tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return {5e-6, 2.5e-5};  // fp32 accumulation over up to 100K tokens, summed in order
    case DType::kFloat16: return {5e-5, rounding_rtol(dtype)};
    case DType::kBFloat16: return {1e-4, rounding_rtol(dtype)};
  }
  return {0, 0};
}
/// The device kernels (tests/gpu, and the same tests under the simulator): the host's bounds.
inline Tolerance kernel_tolerance(DType dtype) { return tolerance(dtype); }
/// Large-magnitude logits (|q|, |k| in [8, 30], logits in the hundreds to thousands): a logit of
/// size L carries ~u L of fp32 rounding (u = 2^-24), but at these sizes one token takes all the
/// weight (the next is e^-hundreds below), so the output is its value: measured under the
/// simulator at most 1.8e-7 (fp32), and fp16 / bf16 within their own rounding
/// (GpuKernels.LargeMagnitudeLogits; 2e-3 / 3e-3 / 1e-2 were allowed before). The ordinary bounds.
inline Tolerance large_logit_tolerance(DType dtype) { return tolerance(dtype); }

struct ProblemSpec {
  AttentionSpec spec;
  std::vector<int> lens;  // per sequence; 0 marks a padded row
  int q_len = 1;          // query rows per sequence (DecodeArgs::q_len); lens >= q_len or 0
  int max_seq_len = 0;    // 0: max(lens)
  int extra_stride = 0;   // block table columns beyond what max_seq_len needs
  int num_blocks = 0;     // 0: enough for distinct ids, capped at 97 (forces repeats)
  bool distinct_blocks = false;
  bool alibi = false;
  bool large_logits = false;
  uint64_t seed = 1;
  /// fp8 caches (spec.kv_dtype): K and V are random values in [-kv_magnitude, kv_magnitude)
  /// quantised with these scales (rne, saturated: numeric.hpp), or, where a scale is 0, with amax /
  /// 256 of the values (FlashInfer's calibration rule; per KV head with spec.kv_scale_per_head).
  /// A magnitude above max * scale saturates codes; the reference reads the codes as they are.
  float k_scale = 0.5f;
  float v_scale = 0.25f;
  float kv_magnitude = 1.0f;
};

struct Problem {
  ProblemSpec ps;
  DecodeArgs args;
  Buffer q, out, k, v, poisoned;
  std::vector<int32_t> tables, lens;
  std::vector<float> slopes;
  std::vector<float> k_scales, v_scales;  // fp8 caches: [spec.kv_scale_count()]
  std::vector<float> sinks;  // attention sinks [num_q_heads], or empty (set_sinks)
  std::vector<double> ref;
  std::vector<bool> mask;  // [num_seqs * q_len] rows of sequences with seq_len > 0
  std::size_t out_elems = 0;
  int rows() const { return args.num_seqs * args.q_len; }

  /// Attention sinks, `sigma` for every head (host pointer in args; the device mirrors copy it).
  void set_sinks(const std::vector<float>& values) {
    sinks = values;
    args.sinks = sinks.empty() ? nullptr : sinks.data();
  }
  /// Resets the output to the NaN pattern.
  void poison_out() { std::memcpy(out.data(), poisoned.data(), poisoned.bytes); }
  /// Fills ref with the float64 reference (padded rows stay NaN).
  void run_reference() {
    ref.assign(out_elems, std::nan(""));
    decodegraph::reference::paged_attention(args, ref.data());
  }
  /// Padded rows of out still hold the poison bit pattern.
  ::testing::AssertionResult padded_rows_untouched() const {
    const std::size_t row = static_cast<std::size_t>(args.spec.num_q_heads) * args.spec.head_size *
                            decodegraph::dtype_size(args.spec.dtype);
    for (int s = 0; s < rows(); ++s) {
      if (lens[s / args.q_len] != 0) continue;
      const auto* a = static_cast<const unsigned char*>(out.data()) + s * row;
      const auto* b = static_cast<const unsigned char*>(poisoned.data()) + s * row;
      if (std::memcmp(a, b, row) != 0)
        return ::testing::AssertionFailure() << "padded row " << s << " was written";
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult check(Tolerance t) const {
    return check_close(args.spec.dtype, out.data(), ref.data(), rows(),
                       args.spec.num_q_heads, args.spec.head_size, t.atol, t.rtol, mask);
  }
  Tolerance tol() const {
    return ps.large_logits ? large_logit_tolerance(args.spec.dtype) : tolerance(args.spec.dtype);
  }
};

/// Random values whose magnitude lies in [lo, hi], random sign.
inline void fill_magnitude(DType dtype, void* buf, std::size_t n, std::mt19937_64& rng, float lo,
                           float hi) {
  std::uniform_real_distribution<float> mag(lo, hi);
  std::bernoulli_distribution neg(0.5);
  for (std::size_t i = 0; i < n; ++i)
    decodegraph::store_from_float(dtype, buf, i, neg(rng) ? -mag(rng) : mag(rng));
}

/// vLLM-style ALiBi slopes 2^(-8 (h+1) / H).
inline std::vector<float> alibi_slopes(int num_heads) {
  std::vector<float> s(num_heads);
  for (int h = 0; h < num_heads; ++h)
    s[h] = static_cast<float>(std::pow(2.0, -8.0 * (h + 1) / num_heads));
  return s;
}

/// KV head of element i of a cache of `s` (both of the vLLM layouts keep a block's heads apart in
/// [num_blocks, kv_heads, ...]; NHD interleaves them per token).
inline int cache_head(const AttentionSpec& s, std::size_t i) {
  if (s.layout == KVLayout::kNHD) return static_cast<int>((i / s.head_size) % s.num_kv_heads);
  return static_cast<int>((i / (static_cast<std::size_t>(s.head_size) * s.block_size)) % s.num_kv_heads);
}

/// fp8 caches: n random values with magnitudes in [lo_share * mag, mag) (random sign) quantised into
/// codes with `scale`, or with amax / 256 of the values where scale is 0 (per KV head when
/// s.kv_scale_per_head). Returns the scales [s.kv_scale_count()].
inline std::vector<float> quantise_cache(const AttentionSpec& s, void* codes, std::size_t n, std::mt19937_64& rng,
                                         float mag, float scale, float lo_share) {
  std::vector<float> x(n);
  std::uniform_real_distribution<float> u(lo_share, 1.0f);
  std::bernoulli_distribution neg(0.5);
  for (float& v : x) v = (neg(rng) ? -mag : mag) * u(rng);
  std::vector<float> scales(s.kv_scale_count(), scale);
  if (scale == 0.0f) {
    std::vector<float> amax(scales.size(), 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      float& m = amax[s.kv_scale_per_head ? cache_head(s, i) : 0];
      m = std::max(m, std::fabs(x[i]));
    }
    for (std::size_t h = 0; h < scales.size(); ++h) scales[h] = amax[h] > 0 ? amax[h] / 256.0f : 1.0f;
  }
  for (std::size_t i = 0; i < n; ++i)
    static_cast<uint8_t*>(codes)[i] =
        decodegraph::float_to_fp8_bits(s.kv_dtype, x[i] / scales[s.kv_scale_per_head ? cache_head(s, i) : 0]);
  return scales;
}

inline std::unique_ptr<Problem> make_problem(const ProblemSpec& ps) {
  auto p = std::make_unique<Problem>();
  p->ps = ps;
  const AttentionSpec& s = ps.spec;
  std::mt19937_64 rng(ps.seed);
  const int num_seqs = static_cast<int>(ps.lens.size());
  const int max_len =
      ps.max_seq_len > 0 ? ps.max_seq_len : *std::max_element(ps.lens.begin(), ps.lens.end());
  const int stride = (max_len + s.block_size - 1) / s.block_size + ps.extra_stride;
  int used = 0;
  for (int len : ps.lens) used += (len + s.block_size - 1) / s.block_size;
  int num_blocks = ps.num_blocks;
  if (num_blocks == 0) num_blocks = ps.distinct_blocks ? std::max(used, 1) : std::clamp(used, 1, 97);

  DecodeArgs& a = p->args;
  a.spec = s;
  a.num_seqs = num_seqs;
  a.q_len = ps.q_len;
  a.max_seq_len = max_len;
  a.block_table_stride = stride;
  a.num_blocks = num_blocks;

  const std::size_t qn = static_cast<std::size_t>(num_seqs) * ps.q_len * s.num_q_heads * s.head_size;
  const std::size_t cn = static_cast<std::size_t>(num_blocks) * s.block_elems();
  p->out_elems = qn;
  p->q = make_buffer(s.dtype, qn);
  p->out = make_buffer(s.dtype, qn);
  p->poisoned = make_buffer(s.dtype, qn);
  p->k = Buffer(cn * s.kv_elem_size());
  p->v = Buffer(cn * s.kv_elem_size());
  if (s.fp8_kv()) {
    const float lo = ps.large_logits ? 8.f : 0.f, hi = ps.large_logits ? 30.f : 1.f;
    if (ps.large_logits) fill_magnitude(s.dtype, p->q.data(), qn, rng, lo, hi); else fill_uniform(s.dtype, p->q.data(), qn, rng);
    p->k_scales = quantise_cache(s, p->k.data(), cn, rng, ps.kv_magnitude * hi, ps.k_scale, lo / hi);
    p->v_scales = quantise_cache(s, p->v.data(), cn, rng, ps.kv_magnitude, ps.v_scale, 0.f);
    a.k_scale = p->k_scales.data();
    a.v_scale = p->v_scales.data();
  } else if (ps.large_logits) {
    fill_magnitude(s.dtype, p->q.data(), qn, rng, 8.f, 30.f);
    fill_magnitude(s.dtype, p->k.data(), cn, rng, 8.f, 30.f);
  } else {
    fill_uniform(s.dtype, p->q.data(), qn, rng);
    fill_uniform(s.dtype, p->k.data(), cn, rng);
  }
  if (!s.fp8_kv()) fill_uniform(s.dtype, p->v.data(), cn, rng);
  poison(s.dtype, p->poisoned.data(), qn);
  p->poison_out();

  // Unused entries hold -1: reading one would be a bug that the reference and host checks miss.
  p->tables.assign(static_cast<std::size_t>(num_seqs) * stride, -1);
  std::vector<int32_t> perm(num_blocks);
  for (int i = 0; i < num_blocks; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int32_t> any_block(0, num_blocks - 1);
  int next = 0;
  for (int sq = 0; sq < num_seqs; ++sq)
    for (int j = 0; j < (ps.lens[sq] + s.block_size - 1) / s.block_size; ++j)
      p->tables[static_cast<std::size_t>(sq) * stride + j] =
          ps.distinct_blocks ? perm[next++] : any_block(rng);
  p->lens.assign(ps.lens.begin(), ps.lens.end());
  p->mask.resize(static_cast<std::size_t>(num_seqs) * ps.q_len);
  for (int r = 0; r < num_seqs * ps.q_len; ++r) p->mask[r] = ps.lens[r / ps.q_len] > 0;
  if (ps.alibi) p->slopes = alibi_slopes(s.num_q_heads);

  a.q = p->q.data();
  a.out = p->out.data();
  a.k_cache = p->k.data();
  a.v_cache = p->v.data();
  a.block_tables = p->tables.data();
  a.seq_lens = p->lens.data();
  a.alibi_slopes = ps.alibi ? p->slopes.data() : nullptr;
  return p;
}

/// A sliding window's freed blocks, as vLLM's hybrid allocator leaves them: every block wholly before
/// sequence i's window (positions < len - W, W = spec.sliding_window) gets NaN in K and V (every
/// head) and its table entry becomes an invalid id (alternately -1 and num_blocks + 1000). Needs
/// ps.distinct_blocks (no block is shared with an attended one). Returns the blocks poisoned.
inline int free_blocks_outside_window(Problem& p) {
  const AttentionSpec& s = p.args.spec;
  // The earliest row (q_len > 1: row 0, at position len - q_len) sets the first position read.
  const int W = s.sliding_window > 0 ? s.sliding_window + p.args.q_len - 1 : 0, bs = s.block_size;
  if (W <= 0) return 0;
  const std::size_t elems = s.block_elems();
  int freed = 0;
  for (int sq = 0; sq < p.args.num_seqs; ++sq) {
    const int first = p.lens[sq] > W ? p.lens[sq] - W : 0;  // first attended position
    for (int j = 0; j < first / bs; ++j) {
      int32_t& entry = p.tables[static_cast<std::size_t>(sq) * p.args.block_table_stride + j];
      const std::size_t base = static_cast<std::size_t>(entry) * elems;
      for (Buffer* b : {&p.k, &p.v}) {
        if (s.fp8_kv()) {
          std::memset(static_cast<unsigned char*>(b->data()) + base, 0x7f, elems);  // NaN in E4M3 and E5M2
        } else {
          for (std::size_t i = 0; i < elems; ++i) decodegraph::store_from_float(s.dtype, b->data(), base + i, NAN);
        }
      }
      entry = freed % 2 == 0 ? -1 : p.args.num_blocks + 1000;
      ++freed;
    }
  }
  return freed;
}

/// Overwrites K (`key`) or V of token `pos` of sequence `seq` (every KV head, every d) with
/// `value` (+-inf or NaN): fp8 caches store a code that decodes to it (E4M3 has no inf: its NaN
/// code 0x7f, what the append stores for a NaN input). The sequence's blocks must be its own
/// (ps.distinct_blocks).
inline void set_cache_value(Problem& p, int seq, int pos, bool key, float value) {
  const AttentionSpec& s = p.args.spec;
  const int32_t block = p.tables[static_cast<std::size_t>(seq) * p.args.block_table_stride + pos / s.block_size];
  const int x = decodegraph::math::vllm_x(static_cast<int>(s.kv_elem_size()));
  void* base = (key ? p.k : p.v).data();
  for (int h = 0; h < s.num_kv_heads; ++h)
    for (int d = 0; d < s.head_size; ++d) {
      const int64_t i = key ? decodegraph::math::k_offset(s.layout, block, h, pos % s.block_size, d, s.num_kv_heads,
                                                          s.head_size, s.block_size, x)
                            : decodegraph::math::v_offset(s.layout, block, h, pos % s.block_size, d, s.num_kv_heads,
                                                          s.head_size, s.block_size);
      if (!s.fp8_kv()) {
        decodegraph::store_from_float(s.dtype, base, static_cast<std::size_t>(i), value);
      } else {
        const bool e4m3 = s.kv_dtype == decodegraph::KVCacheDType::kFp8E4M3;
        const uint8_t code = std::isnan(value) || e4m3 ? 0x7f : value > 0 ? 0x7c : 0xfc;
        static_cast<uint8_t*>(base)[i] = code;
      }
    }
}

/// A case of non-finite values at positions some rows read but must not attend (issue 39): q_len
/// rows, a window, and the (position, K or V) entries overwritten with +-inf / NaN. For every query
/// row the positions it attends follow from lens, q_len and the window; a row that attends none of
/// them must come out bitwise as with the cache's finite values there, the others non-finite.
struct MaskedRead {
  const char* name;
  int len, q_len, window;
  struct At {
    int pos;
    bool key;
  };
  std::vector<At> at;
  /// Whether query row j (of q_len) of the sequence attends position pos.
  bool attends(int j, int pos) const {
    const int q = len - q_len + j;
    return pos <= q && (window <= 0 || pos > q - window);
  }
  bool row_attends_any(int j) const {
    for (const At& a : at)
      if (attends(j, a.pos)) return true;
    return false;
  }
};
/// The two inputs and the lead skew of q_len rows under a window: (a) q_len 4, L 300, V at
/// 299 (only row 3 attends it) and K at 298 (rows 2, 3); (b) W 20, L 300, V at 279 (the window's
/// first block, before the window) and K at 275; (c) q_len 3, W 20, L 300: V at 278 (row 0 only),
/// K at 279 (rows 0, 1) and V at 299 (row 2 only).
inline std::vector<MaskedRead> masked_read_cases() {
  return {{"q_len 4 drafts", 300, 4, 0, {{299, false}, {298, true}}},
          {"window edge block", 300, 1, 20, {{279, false}, {275, true}}},
          {"q_len 3 under a window", 300, 3, 20, {{278, false}, {279, true}, {299, false}}}};
}

/// The (dtype, cache dtype, GQA group) of the masked-read tests: each math (CUDA cores: fp32 and
/// groups below 4 at one row per head; tensor cores: 16-bit groups of 4, q_len rows, fp8 caches)
/// and each cache type.
struct MaskedReadConfig {
  DType dtype;
  decodegraph::KVCacheDType kv;
  int group;
};
inline std::vector<MaskedReadConfig> masked_read_configs() {
  using decodegraph::KVCacheDType;
  return {{DType::kFloat16, KVCacheDType::kAuto, 1},    {DType::kFloat16, KVCacheDType::kAuto, 4},
          {DType::kBFloat16, KVCacheDType::kAuto, 1},   {DType::kBFloat16, KVCacheDType::kAuto, 4},
          {DType::kFloat32, KVCacheDType::kAuto, 1},    {DType::kBFloat16, KVCacheDType::kFp8E4M3, 1},
          {DType::kFloat16, KVCacheDType::kFp8E5M2, 4}};
}
/// The problem of case c under config cf (one sequence, distinct blocks; head size, block size 16
/// or 32 and layout from `i`; block 8 would start the window's reads at 280 and read nothing
/// masked in case (b)).
inline ProblemSpec masked_read_problem(const MaskedRead& c, const MaskedReadConfig& cf, KVLayout layout, int i) {
  ProblemSpec ps;
  ps.spec.dtype = cf.dtype;
  ps.spec.kv_dtype = cf.kv;
  ps.spec.head_size = i % 2 ? 64 : 128;
  ps.spec.block_size = i % 3 == 0 ? 32 : 16;
  ps.spec.layout = layout;
  ps.spec.num_q_heads = 2 * cf.group;
  ps.spec.num_kv_heads = 2;
  ps.spec.sliding_window = c.window;
  ps.q_len = c.q_len;
  ps.lens = {c.len};
  ps.distinct_blocks = true;
  ps.seed = 6100 + static_cast<uint64_t>(i);
  return ps;
}
/// +inf, -inf and NaN in turn.
inline float masked_read_value(int i) {
  const float v[] = {INFINITY, -INFINITY, NAN};
  return v[i % 3];
}

/// Rows of p.out (one sequence, q_len rows) compared with `clean` (the output bytes with finite values
/// at the case's positions): rows that attend none of them bitwise equal, the others with every
/// element non-finite.
inline ::testing::AssertionResult check_masked_rows(const Problem& p, const MaskedRead& c,
                                                    const std::vector<unsigned char>& clean) {
  const AttentionSpec& s = p.args.spec;
  const std::size_t elems = static_cast<std::size_t>(s.num_q_heads) * s.head_size;
  const std::size_t row_bytes = elems * decodegraph::dtype_size(s.dtype);
  const auto* out = static_cast<const unsigned char*>(p.out.data());
  for (int j = 0; j < c.q_len; ++j) {
    if (!c.row_attends_any(j)) {
      if (std::memcmp(out + j * row_bytes, clean.data() + j * row_bytes, row_bytes) != 0)
        return ::testing::AssertionFailure() << c.name << ": row " << j
                                             << " attends none of the non-finite positions but changed";
      continue;
    }
    for (std::size_t e = 0; e < elems; ++e) {
      const float v = decodegraph::load_as_float(s.dtype, p.out.data(), j * elems + e);
      if (std::isfinite(v))
        return ::testing::AssertionFailure() << c.name << ": row " << j << " attends a non-finite value but element "
                                             << e << " is " << v;
    }
  }
  return ::testing::AssertionSuccess();
}

/// A sink far above every logit (issue 39): logits near 0 (scale 1e-6) and sinks sigma of 80 to
/// 1000 on every head, so sigma - M is sigma. Where V is large (v_mag: 1e30 for fp32 / bf16 caches,
/// an fp8 v_scale of 1e30) the answer, ~ e^-sigma v_mag, is a normal float for sigma < 90: there a
/// kernel that shifts by the logits' max alone, and overflows e^(sigma - M) (at sigma > 88.7, or
/// 78.3 on the fp16 tensor-core path's 2^15-scaled weights), returns 0 instead. Above, the answer is
/// below what fp32 weights resolve (e^-100 is a subnormal with 5 bits): finite and ~0 is the test.
struct SinkAbove {
  MaskedReadConfig cf;
  float v_mag;  // 1: the problem's own values
  std::vector<float> sigmas;
};
inline std::vector<SinkAbove> sink_above_cases() {
  using decodegraph::KVCacheDType;
  return {{{DType::kFloat32, KVCacheDType::kAuto, 1}, 1e30f, {89.5f, 100.0f, 1000.0f}},
          {{DType::kBFloat16, KVCacheDType::kAuto, 1}, 1e30f, {89.5f, 100.0f, 1000.0f}},
          {{DType::kBFloat16, KVCacheDType::kAuto, 4}, 1e30f, {89.5f, 100.0f, 1000.0f}},
          {{DType::kFloat16, KVCacheDType::kAuto, 4}, 1.0f, {80.0f, 100.0f, 1000.0f}},
          {{DType::kFloat16, KVCacheDType::kAuto, 1}, 1.0f, {100.0f, 1000.0f}},
          {{DType::kBFloat16, KVCacheDType::kFp8E4M3, 4}, 1e30f, {80.0f, 89.5f, 100.0f, 1000.0f}},
          {{DType::kFloat16, KVCacheDType::kFp8E5M2, 1}, 1.0f, {100.0f, 1000.0f}}};
}
/// The problem of a case (two sequences, 300 and 17 tokens; V2 at 64 spans five partitions), V made
/// v_mag times larger (fp8: v_scale), sinks sigma on every head.
inline std::unique_ptr<Problem> sink_above_problem(const SinkAbove& c, float sigma, KVLayout layout, int i) {
  ProblemSpec ps;
  ps.spec.dtype = c.cf.dtype;
  ps.spec.kv_dtype = c.cf.kv;
  ps.spec.head_size = 64;
  ps.spec.block_size = 16;
  ps.spec.layout = layout;
  ps.spec.num_q_heads = 2 * c.cf.group;
  ps.spec.num_kv_heads = 2;
  ps.spec.scale = 1e-6f;
  ps.lens = {300, 17};
  ps.distinct_blocks = true;
  ps.seed = 6300 + static_cast<uint64_t>(i);
  auto p = make_problem(ps);
  const AttentionSpec& s = p->args.spec;
  if (s.fp8_kv()) {
    for (float& v : p->v_scales) v *= c.v_mag;
  } else if (c.v_mag != 1.0f) {
    const std::size_t n = p->v.bytes / s.kv_elem_size();
    for (std::size_t e = 0; e < n; ++e)
      decodegraph::store_from_float(s.dtype, p->v.data(), e, decodegraph::load_as_float(s.dtype, p->v.data(), e) * c.v_mag);
  }
  p->set_sinks(std::vector<float>(static_cast<std::size_t>(s.num_q_heads), sigma));
  return p;
}
/// The tolerance of a case. Where the answer is resolved (v_mag > 1, sigma < 90) it is relative to
/// its scale, S = len e^-sigma v_mag (len tokens of weight ~e^-sigma each against the sink's 1, values
/// up to v_mag): the dtype's atol times S, plus the fp32 weights' own rounding, which are subnormals
/// here (e^(m - sigma) ~ 2^-129: 2^-149 steps, so each weight carries up to 2^-21 of itself, and the
/// output up to 2^-21 S). Elsewhere the answer is ~0 and the dtype's own tolerance applies.
inline Tolerance sink_above_tolerance(DType dtype, float sigma, float v_mag, int len) {
  const Tolerance t = tolerance(dtype);
  if (v_mag <= 1.0f || sigma >= 90.0f) return t;
  const double S = len * std::exp(-static_cast<double>(sigma)) * v_mag;
  return {(t.atol + std::ldexp(1.0, -21)) * S, t.rtol};
}

/// Runs host V2 with a workspace of exactly the queried size.
inline std::vector<std::uint64_t> run_host_v2(const DecodeArgs& a, int partition_size) {
  const std::size_t bytes =
      decodegraph::v2_workspace_size(a.spec, a.num_seqs, a.max_seq_len, partition_size, a.q_len);
  std::vector<std::uint64_t> ws(bytes / 8 + 2);
  // Poison the workspace too: the merge must read only partials pass 1 wrote.
  std::fill(ws.begin(), ws.end(), 0x7ff8dead7ff8deadull);
  decodegraph::host::paged_attention_v2(a, partition_size, ws.data(), bytes);
  return ws;
}

}  // namespace dgtest
