// Host implementation of paged decode attention V1 and V2 (host:: in attention.hpp).
//
// It mirrors the kernels' partitioning, softmax tiling and merge, and takes every per-token and
// merge formula from kernels/decode_math.hpp, so that the executor's host backend is a faithful
// model of the device path, per math (decode_policy.hpp, pass1_uses_tensor_cores):
//   - logits in base 2, tiles of the kernel's tile size (pass1_tile_tokens) from the partition's
//     start, one online-softmax step per tile (the running max moves only there, and the
//     accumulators are rescaled only when it moved);
//   - the CUDA-core math (fp32; fp16 / bf16 with GQA groups 1-3): fp32 weights 2^(s - m);
//   - the tensor-core math (fp16 / bf16, groups >= 4): each weight as the kernel feeds it to the
//     p.v mma (TcPass1Policy::kPvWeights): hi + lo in the model dtype (or hi alone when rounded),
//     fp16 scaled by 2^15, and the output normalised by the sum of those same weights.
//   - fp8 caches (the tensor-core math at every group, on fp16 operands): codes decoded exactly,
//     q as the kernel converts it (fp16 as it is; bf16 scaled per row by 2^s and rounded to fp16,
//     math::fp8_q_shift), k_scale and 2^-s folded into the logit scale (math::fp8_scale2), the
//     fp16 path's weights, and v_scale applied to the output (V1) or the partial output (V2).
// exp2f stands in for ex2.approx (2 ulp) and the order of the fp32 sums differs, so host and
// device agree to fp32 noise, not bitwise (tests/sim/sim_sweep_test.cpp compares them).
//   V1: per (sequence, KV head) one online-softmax pass over the whole context for all query heads
//       of the GQA group at once (K/V converted once per cache block).
//   V2: the same pass per partition of P tokens, writing fp32 partials (m_p, l_p, acc_p / l_p) into the
//       caller's workspace as laid out by v2_workspace_layout; then a merge per (sequence, query head)
//       in the merge kernel's fixed order (kernels/merge_policy.hpp), w_p = l_p exp(m_p - M). A
//       single partition is copied.
// Variants (decode_math.hpp): a sliding window starts the pass (V1) and the partitions (V2) at the
// window's first cache block and masks that block's tokens before the window to -inf (after the
// soft-cap, which each logit takes right after its scale and bias); an attention sink enters V1's
// final denominator, and V2's merge, once per row.
// q_len > 1: a KV head's pass serves its group's heads for every query row (rows = group x q_len,
// the math chosen by that count, as the launcher does); each row masks what lies after its query
// and before its own window. Partials and the merge are per (sequence, row, head).
// fp32 accumulation throughout. Rows with seq_len 0 (executor padding) leave out untouched. q and
// out rows honour q_stride / out_stride (e.g. q inside a fused QKV buffer).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/numeric.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_policy.hpp"
#include "kernels/merge_policy.hpp"
#include "kernels/validate.hpp"

namespace decodegraph::host {
namespace {

// ---------------------------------------------------------------- element types

// fp16 -> float via a 64K-entry table: the conversion is the hot loop of the host path.
const std::array<float, 65536>& fp16_table() {
  static const std::array<float, 65536> table = [] {
    std::array<float, 65536> t{};
    for (uint32_t i = 0; i < 65536; ++i) t[i] = fp16_bits_to_float(static_cast<uint16_t>(i));
    return t;
  }();
  return table;
}

// round(): a float rounded to the element type (the tensor-core math's weights); shift: the log2
// scale of those weights (math::kTcWeightShiftFp16 for fp16).
struct Fp16 {
  using T = uint16_t;
  static constexpr int kWeightShift = math::kTcWeightShiftFp16;
  const float* table = fp16_table().data();
  float load(T v) const { return table[v]; }
  static T store(float f) { return float_to_fp16_bits(f); }
  static float round(float f) { return fp16_bits_to_float(float_to_fp16_bits(f)); }
};
struct Bf16 {
  using T = uint16_t;
  static constexpr int kWeightShift = 0;
  static float load(T v) { return bf16_bits_to_float(v); }
  static T store(float f) { return float_to_bf16_bits(f); }
  static float round(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }
};
struct Fp32 {
  using T = float;
  static constexpr int kWeightShift = 0;
  static float load(T v) { return v; }
  static T store(float f) { return f; }
  static float round(float f) { return f; }
};

// Cache element types: the model's own (Fp16, Bf16, Fp32: kFp8 false) or fp8 codes (decoded
// exactly through a 256-entry table; the values are unscaled: K = value * k_scale).
template <KVCacheDType kKind>
struct Fp8 {
  using T = uint8_t;
  static constexpr bool kFp8 = true;
  const float* table = fp8_table().data();
  float load(T v) const { return table[v]; }
  static const std::array<float, 256>& fp8_table() {
    static const std::array<float, 256> t = [] {
      std::array<float, 256> r{};
      for (int i = 0; i < 256; ++i) r[i] = fp8_bits_to_float(kKind, static_cast<uint8_t>(i));
      return r;
    }();
    return t;
  }
};
template <class C>
constexpr bool is_fp8() {
  if constexpr (requires { C::kFp8; }) return C::kFp8;
  return false;
}

// ---------------------------------------------------------------- geometry

// Offsets of K/V elements split as base(block, kv_head) + rel(token, d), which holds for both
// layouts (math::k_offset / v_offset). The rel offsets of one block are compiled once per call into
// runs of consecutive source elements, so converting a block tile is a few strided copies
// (NHD: one run per token, vLLM K: runs of x, vLLM V: one run per d across tokens) instead of a
// per-element gather: that gather was the host path's bottleneck.
struct Run {
  int64_t src;     // rel offset of the first source element
  int32_t dst;     // index of its destination in the [block_size, head_size] tile
  int32_t stride;  // destination step per source element
  int32_t len;
};

std::vector<Run> compile_runs(const std::vector<int64_t>& rel) {
  std::vector<std::pair<int64_t, int32_t>> by_src(rel.size());
  for (std::size_t i = 0; i < rel.size(); ++i) by_src[i] = {rel[i], static_cast<int32_t>(i)};
  std::sort(by_src.begin(), by_src.end());
  std::vector<Run> runs;
  for (const auto& [src, dst] : by_src) {
    if (!runs.empty()) {
      Run& r = runs.back();
      if (src == r.src + r.len && (r.len == 1 || dst == r.dst + r.len * r.stride)) {
        if (r.len == 1) r.stride = dst - r.dst;
        ++r.len;
        continue;
      }
    }
    runs.push_back(Run{src, dst, 1, 1});
  }
  return runs;
}

struct Geometry {
  const AttentionSpec& s;
  int hs, bs, group, x;
  int q_len;           // query rows per sequence
  int rows;            // query rows a KV head serves: group * q_len, row v = (token v / group, head v % group)
  float scale;         // the softmax scale
  float scale2;        // scale * log2(e): logits in base 2, as the kernels keep them (kv_dtype auto)
  float cap2;          // the soft-cap in base 2 (c * log2(e)); 0: off
  float cap2_k;        // math::softcap2_k(cap2), as the launcher forms it
  bool tensor_cores;   // the math the launcher selects for this spec
  int tile;            // the kernel's tile: one online-softmax step per `tile` tokens
  int chunk;           // tokens converted at once: whole cache blocks covering whole tiles
  std::vector<Run> k_runs, v_runs;

  Geometry(const AttentionSpec& spec, int n)
      : s(spec),
        hs(spec.head_size),
        bs(spec.block_size),
        group(spec.num_q_heads / spec.num_kv_heads),
        x(math::vllm_x(static_cast<int>(spec.kv_elem_size()))),
        q_len(n),
        rows(group * n),
        scale(spec.effective_scale()),
        scale2(spec.effective_scale() * math::kLog2e),
        cap2(spec.logit_softcap * math::kLog2e),
        cap2_k(math::softcap2_k(cap2)),
        tensor_cores(kernels::pass1_uses_tensor_cores(static_cast<int>(spec.kv_elem_size()), kernels::pass1_rows(group, n))),
        tile(kernels::pass1_tile_tokens(static_cast<int>(spec.kv_elem_size()), spec.head_size)),
        chunk(std::max(bs, tile)) {
    std::vector<int64_t> k_rel(static_cast<std::size_t>(bs) * hs), v_rel(k_rel.size());
    const int64_t k0 = k_base(0, 0), v0 = v_base(0, 0);
    for (int t = 0; t < bs; ++t)
      for (int d = 0; d < hs; ++d) {
        k_rel[t * hs + d] = math::k_offset(s.layout, 0, 0, t, d, s.num_kv_heads, hs, bs, x) - k0;
        v_rel[t * hs + d] = math::v_offset(s.layout, 0, 0, t, d, s.num_kv_heads, hs, bs) - v0;
      }
    k_runs = compile_runs(k_rel);
    v_runs = compile_runs(v_rel);
  }
  int64_t k_base(int64_t block, int kvh) const {
    return math::k_offset(s.layout, block, kvh, 0, 0, s.num_kv_heads, hs, bs, x);
  }
  int64_t v_base(int64_t block, int kvh) const {
    return math::v_offset(s.layout, block, kvh, 0, 0, s.num_kv_heads, hs, bs);
  }
};

// Converts one whole block of one KV head into a float tile [block_size, head_size].
template <class E>
void load_tile(const E& e, const typename E::T* base, const std::vector<Run>& runs, float* tile) {
  for (const Run& r : runs) {
    const typename E::T* src = base + r.src;
    float* dst = tile + r.dst;
    if (r.stride == 1) {
      for (int j = 0; j < r.len; ++j) dst[j] = e.load(src[j]);
    } else {
      for (int j = 0; j < r.len; ++j) dst[static_cast<int64_t>(j) * r.stride] = e.load(src[j]);
    }
  }
}

// Online-softmax state of the query rows (group heads x q_len tokens) of one KV head over a token
// range. m is in base 2; l and acc are relative to it (and, on the tensor-core path with fp16,
// scaled by 2^15).
struct GroupState {
  std::vector<float> q;      // [rows, head_size] (fp8 caches: as the kernel converts it)
  std::vector<float> slope2;  // [rows], ALiBi slope * log2(e)
  std::vector<float> scale2;  // [rows], the logit scale in base 2 (fp8: with k_scale and 2^-s)
  std::vector<int> first, len;  // [rows]: the row's first attended position and its length (query at len - 1)
  float vscale = 1.0f;        // fp8: v_scale of the KV head
  std::vector<float> m, l;   // [rows]
  std::vector<float> acc;    // [rows, head_size]
  std::vector<float> kf, vf, s;  // one chunk of whole cache blocks: [chunk, head_size] x2, [tile]

  GroupState(const Geometry& g)
      : q(static_cast<std::size_t>(g.rows) * g.hs), slope2(g.rows), scale2(g.rows, g.scale2), first(g.rows),
        len(g.rows), m(g.rows), l(g.rows), acc(static_cast<std::size_t>(g.rows) * g.hs),
        kf(static_cast<std::size_t>(g.chunk) * g.hs), vf(kf.size()), s(g.tile) {}
  /// Row v's length and first position for a sequence of seq_len tokens (q_len rows).
  void set_lengths(const Geometry& g, int seq_len) {
    for (int v = 0; v < g.rows; ++v) {
      len[v] = math::row_len(seq_len, g.q_len, v / g.group);
      first[v] = math::window_first(len[v], g.s.sliding_window);
    }
  }
  void reset() {
    std::fill(m.begin(), m.end(), math::neg_inf());
    std::fill(l.begin(), l.end(), 0.0f);
    std::fill(acc.begin(), acc.end(), 0.0f);
  }
};

// Eight independent partial sums let the compiler vectorise without reassociating (head sizes are
// multiples of 16).
inline float dot(const float* a, const float* b, int n) {
  float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int d = 0; d < n; d += 8)
    for (int j = 0; j < 8; ++j) p[j] += a[d + j] * b[d + j];
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

// The weight the kernel's p.v uses for 2^x: fp32 on the CUDA-core math; on the tensor-core math
// the hi / lo parts in the element type (TcPass1Policy::kPvWeights), summed exactly in fp32.
template <class E>
float pv_weight(bool tensor_cores, float x) {
  const float p = exp2f(x);
  if (!tensor_cores) return p;
  const float hi = E::round(p);
  if (kernels::kTcPvWeights == kernels::TcPvWeights::kRounded) return hi;
  return hi + E::round(p - hi);
}

// Folds tokens [t0, t1) of one sequence's KV head `kvh` into st: chunks of whole cache blocks
// (t0 is a multiple of the block size), one online-softmax step per kernel tile from t0 on. Each
// row masks to -inf the tokens before its first position (a window) and after its query (q_len > 1).
// E: the math's element type (its weights on tensor cores; fp16 for fp8 caches); C: the cache's.
template <class E, class C>
void attend(const Geometry& g, const C& e, const typename C::T* kc, const typename C::T* vc,
            const int32_t* table, int kvh, int t0, int t1, GroupState& st) {
  const int hs = g.hs, bs = g.bs;
  const float shift = g.tensor_cores ? static_cast<float>(E::kWeightShift) : 0.0f;
  for (int c = t0; c < t1; c += g.chunk) {
    // Whole blocks (in bounds: the block ids were validated); only tokens < t1 are used.
    for (int b = c; b < std::min(t1, c + g.chunk); b += bs) {
      const int64_t block = table[b / bs];
      load_tile(e, kc + g.k_base(block, kvh), g.k_runs, st.kf.data() + static_cast<std::size_t>(b - c) * hs);
      load_tile(e, vc + g.v_base(block, kvh), g.v_runs, st.vf.data() + static_cast<std::size_t>(b - c) * hs);
    }
    for (int ts = c; ts < std::min(t1, c + g.chunk); ts += g.tile) {
      const int n = std::min(g.tile, t1 - ts);
      const float* kt = st.kf.data() + static_cast<std::size_t>(ts - c) * hs;
      const float* vt = st.vf.data() + static_cast<std::size_t>(ts - c) * hs;
      for (int h = 0; h < g.rows; ++h) {
        const float* q = st.q.data() + static_cast<std::size_t>(h) * hs;
        float tile_max = math::neg_inf();
        for (int i = 0; i < n; ++i) {
          float s = math::logit2(dot(q, kt + static_cast<std::size_t>(i) * hs, hs), st.scale2[h],
                                 math::alibi_bias2(st.slope2[h], ts + i, st.len[h]));
          if (g.cap2 > 0.0f) s = math::softcap2(s, g.cap2, g.cap2_k);
          st.s[i] = ts + i < st.first[h] || ts + i >= st.len[h] ? math::neg_inf() : s;
          tile_max = std::max(tile_max, st.s[i]);
        }
        float* acc = st.acc.data() + static_cast<std::size_t>(h) * hs;
        const math::MaxStep step = math::online_max2(st.m[h], tile_max);
        if (step.moved) {
          const float f = exp2f(st.m[h] - step.sub);
          st.l[h] *= f;
          for (int d = 0; d < hs; ++d) acc[d] *= f;
        }
        st.m[h] = step.m;
        for (int i = 0; i < n; ++i) {
          // A masked token never multiplies its V (0 x inf = NaN): the kernels' edge tiles.
          if (st.s[i] == math::neg_inf()) continue;
          const float p = pv_weight<E>(g.tensor_cores, st.s[i] - (step.sub - shift));
          st.l[h] += p;
          const float* v = vt + static_cast<std::size_t>(i) * hs;
          for (int d = 0; d < hs; ++d) acc[d] += p * v[d];
        }
      }
    }
  }
}

// ---------------------------------------------------------------- validation of host contents

// Host pointers: the actual lengths (0 = padded row allowed) and the table entries they use.
void check_host_contents(const DecodeArgs& a) {
  const std::string len_allowed = "0 .. max_seq_len = 0 .. " + std::to_string(a.max_seq_len);
  const std::string blk_allowed = "0 .. num_blocks - 1 = 0 .. " + std::to_string(a.num_blocks - 1);
  for (int i = 0; i < a.num_seqs; ++i) {
    const int len = a.seq_lens[i];
    require(len >= 0 && len <= a.max_seq_len, "seq_lens[" + std::to_string(i) + "]", len,
            len_allowed);
    if (len > 0)
      require(len >= a.q_len, "seq_lens[" + std::to_string(i) + "]", len,
              "0 (padded row) or at least q_len = " + std::to_string(a.q_len));
    const int32_t* row = a.block_tables + static_cast<int64_t>(i) * a.block_table_stride;
    const int win = math::read_window(a.spec.sliding_window, a.q_len);
    const int j0 = math::window_origin(len, win, a.spec.block_size) / a.spec.block_size;
    for (int j = j0; j < num_partitions(len, a.spec.block_size); ++j)
      require(row[j] >= 0 && row[j] < a.num_blocks,
              "block_tables[" + std::to_string(i) + "][" + std::to_string(j) + "]", row[j],
              blk_allowed);
  }
}

// ---------------------------------------------------------------- V1 / V2

// q of the group's heads as the math reads it, their ALiBi slopes and logit scales. fp8 caches:
// the kernel's fp16 q (bf16 rows scaled by 2^s and rounded to fp16) and k_scale / 2^-s in the
// scale, v_scale of the KV head (scales [kvh] or [0]).
template <class E, bool kFp8>
void load_group(const DecodeArgs& a, const Geometry& g, const E& e, int seq, int kvh,
                GroupState& st) {
  const auto* q = static_cast<const typename E::T*>(a.q);
  const int si = a.spec.kv_scale_per_head ? kvh : 0;
  for (int h = 0; h < g.rows; ++h) {
    const int qh = kvh * g.group + h % g.group;
    const int64_t qrow = static_cast<int64_t>(seq) * g.q_len + h / g.group;
    const int64_t row = qrow * detail::q_row_stride(a) + static_cast<int64_t>(qh) * g.hs;
    float* qf = st.q.data() + static_cast<std::size_t>(h) * g.hs;
    for (int d = 0; d < g.hs; ++d) qf[d] = e.load(q[row + d]);
    st.slope2[h] = a.alibi_slopes ? a.alibi_slopes[qh] * math::kLog2e : 0.0f;
    if constexpr (kFp8) {
      int shift = 0;
      if (a.spec.dtype == DType::kBFloat16) {
        float amax = 0.0f;
        for (int d = 0; d < g.hs; ++d) amax = std::fmax(amax, std::fabs(qf[d]));
        shift = math::fp8_q_shift(amax);
        for (int d = 0; d < g.hs; ++d) qf[d] = Fp16::round(qf[d] * math::pow2f(shift));
      }
      st.scale2[h] = math::fp8_scale2(g.scale, a.k_scale[si], math::pow2f(-shift));
    }
  }
  if constexpr (kFp8) st.vscale = a.v_scale[si];
}

// An output value: acc / l, times v_scale for fp8 caches (as the kernels' epilogue). V1 passes
// l with the sink's term added (v1_denominator); V2's partials never include it.
template <bool kFp8>
float out_value(float acc, float l, const GroupState& st) {
  if constexpr (kFp8) return math::normalise(acc, l) * st.vscale;
  return math::normalise(acc, l);
}

// V1's sink folded into row h of the group (math::sink_fold2, as the kernels' finish): the
// denominator l f + term, and the output's factor f (1 unless the sink raises the max), on the
// weights' scale 2^(s - (m - shift)).
struct V1Denominator {
  float l, oscale;
};
V1Denominator v1_denominator(const DecodeArgs& a, const Geometry& g, const GroupState& st, int kvh, int h, float shift) {
  if (a.sinks == nullptr) return {st.l[h], 1.0f};
  const math::SinkFold sf = math::sink_fold2(a.sinks[kvh * g.group + h % g.group], st.m[h], shift);
  return {st.l[h] * sf.f + sf.term, sf.f};
}

// E: q and out; C: the cache (E itself, or fp8 codes; the math is then fp16's, W).
template <class E, class C = E>
void run_v1(const DecodeArgs& a) {
  constexpr bool kFp8 = is_fp8<C>();
  using W = std::conditional_t<kFp8, Fp16, E>;
  const Geometry g(a.spec, a.q_len);
  const E e{};
  const C c{};
  GroupState st(g);
  const float shift = g.tensor_cores ? static_cast<float>(W::kWeightShift) : 0.0f;
  const auto* kc = static_cast<const typename C::T*>(a.k_cache);
  const auto* vc = static_cast<const typename C::T*>(a.v_cache);
  auto* out = static_cast<typename E::T*>(a.out);
  for (int seq = 0; seq < a.num_seqs; ++seq) {
    const int len = a.seq_lens[seq];
    if (len == 0) continue;  // padded row
    const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
    st.set_lengths(g, len);
    const int origin = math::window_origin(len, math::read_window(a.spec.sliding_window, g.q_len), g.bs);
    for (int kvh = 0; kvh < a.spec.num_kv_heads; ++kvh) {
      load_group<E, kFp8>(a, g, e, seq, kvh, st);
      st.reset();
      attend<W>(g, c, kc, vc, table, kvh, origin, len, st);
      for (int h = 0; h < g.rows; ++h) {
        const int64_t orow = static_cast<int64_t>(seq) * g.q_len + h / g.group;
        const int64_t row = orow * detail::out_row_stride(a) + static_cast<int64_t>(kvh * g.group + h % g.group) * g.hs;
        const V1Denominator den = v1_denominator(a, g, st, kvh, h, shift);
        const float* acc = st.acc.data() + static_cast<std::size_t>(h) * g.hs;
        for (int d = 0; d < g.hs; ++d) out[row + d] = E::store(out_value<kFp8>(acc[d], den.l, st) * den.oscale);
      }
    }
  }
}

template <class E, class C = E>
void run_v2(const DecodeArgs& a, int P, const V2WorkspaceLayout& w, void* workspace) {
  constexpr bool kFp8 = is_fp8<C>();
  using W = std::conditional_t<kFp8, Fp16, E>;
  const Geometry g(a.spec, a.q_len);
  const E e{};
  const C c{};
  GroupState st(g);
  const int H = a.spec.num_q_heads, hs = g.hs;
  auto* ws = static_cast<unsigned char*>(workspace);
  float* max_logits = reinterpret_cast<float*>(ws + w.max_logits_offset);
  float* exp_sums = reinterpret_cast<float*>(ws + w.exp_sums_offset);
  float* partial_out = reinterpret_cast<float*>(ws + w.partial_out_offset);
  const auto* kc = static_cast<const typename C::T*>(a.k_cache);
  const auto* vc = static_cast<const typename C::T*>(a.v_cache);
  auto* out = static_cast<typename E::T*>(a.out);
  std::vector<float> merged(hs);

  for (int seq = 0; seq < a.num_seqs; ++seq) {
    const int len = a.seq_lens[seq];
    if (len == 0) continue;  // padded row
    const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
    // Partitions of P tokens from the window's first block (0 without a window): row 0's window.
    const int origin = math::window_origin(len, math::read_window(a.spec.sliding_window, g.q_len), g.bs);
    const int parts = num_partitions(len - origin, P);
    st.set_lengths(g, len);

    // Pass 1: partials per (KV head group, partition).
    for (int kvh = 0; kvh < a.spec.num_kv_heads; ++kvh) {
      load_group<E, kFp8>(a, g, e, seq, kvh, st);
      for (int p = 0; p < parts; ++p) {
        st.reset();
        attend<W>(g, c, kc, vc, table, kvh, origin + p * P, std::min(len, origin + (p + 1) * P), st);
        // m back to natural units, l without the tensor-core math's fp16 weight scale.
        const float unscale = g.tensor_cores ? std::ldexp(1.0f, -W::kWeightShift) : 1.0f;
        for (int h = 0; h < g.rows; ++h) {
          const int qrow = seq * g.q_len + h / g.group;
          const int64_t idx = math::partial_index(qrow, kvh * g.group + h % g.group, p, H, w.max_partitions);
          max_logits[idx] = st.m[h] * math::kLn2;
          exp_sums[idx] = st.l[h] * unscale;
          const float* acc = st.acc.data() + static_cast<std::size_t>(h) * hs;
          float* po = partial_out + idx * hs;
          for (int d = 0; d < hs; ++d) po[d] = out_value<kFp8>(acc[d], st.l[h], st);
        }
      }
    }

    // Pass 2: the kernel's merge, in its order (kernels/merge_policy.hpp), per query row.
    for (int j = 0; j < g.q_len; ++j) {
      const int qrow = seq * g.q_len + j;
      for (int qh = 0; qh < H; ++qh) {
        const int64_t row = qrow * detail::out_row_stride(a) + static_cast<int64_t>(qh) * hs;
        const int64_t base = math::partial_index(qrow, qh, 0, H, w.max_partitions);
        kernels::merge_row_in_kernel_order(max_logits + base, exp_sums + base, partial_out + base * hs, parts, hs,
                                           merged.data(), a.sinks ? a.sinks[qh] : math::neg_inf());
        for (int d = 0; d < hs; ++d) out[row + d] = E::store(merged[d]);
      }
    }
  }
}

// The one switch over (dtype, kv_dtype): f(E{}, C{}) with E the model dtype's and C the cache's
// element type (validate_spec allows fp8 with fp16 / bf16 only).
template <class F>
void dispatch(const AttentionSpec& s, F&& f) {
  auto with_model = [&](auto c) {
    if (s.dtype == DType::kFloat16) return f(Fp16{}, c);
    return f(Bf16{}, c);
  };
  switch (s.kv_dtype) {
    case KVCacheDType::kFp8E4M3: return with_model(Fp8<KVCacheDType::kFp8E4M3>{});
    case KVCacheDType::kFp8E5M2: return with_model(Fp8<KVCacheDType::kFp8E5M2>{});
    case KVCacheDType::kAuto: break;
  }
  switch (s.dtype) {
    case DType::kFloat16: return f(Fp16{}, Fp16{});
    case DType::kBFloat16: return f(Bf16{}, Bf16{});
    case DType::kFloat32: return f(Fp32{}, Fp32{});
  }
}

}  // namespace

// ---------------------------------------------------------------- entry points

void paged_attention_v1(const DecodeArgs& args) {
  validate_decode_args(args);
  check_host_contents(args);
  detail::check_host_scales(args.spec, args.k_scale, args.v_scale);
  detail::check_host_sinks(args.spec, args.sinks);
  dispatch(args.spec, [&](auto e, auto c) { run_v1<decltype(e), decltype(c)>(args); });
}

void paged_attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                        std::size_t workspace_bytes) {
  const V2WorkspaceLayout w = detail::validate_v2_args(args, partition_size, workspace, workspace_bytes);
  check_host_contents(args);
  detail::check_host_scales(args.spec, args.k_scale, args.v_scale);
  detail::check_host_sinks(args.spec, args.sinks);
  dispatch(args.spec, [&](auto e, auto c) { run_v2<decltype(e), decltype(c)>(args, partition_size, w, workspace); });
}

}  // namespace decodegraph::host
