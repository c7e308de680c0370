// The numerical contract of the pass-1 kernels (docs/design.md, "Numerical contract"), as test
// helpers: a float64 reference of every V2 partition (plain loops over the caches, strides spelled
// out from types.hpp, so it shares nothing with the code under test), the scales the contract is
// written in, and the measurements the tests check.
//
// Per output element (sequence, query head, d) over a token range (a partition, or the whole
// sequence for V1):
//   R      = max_t |v_t[d]|, the output scale;
//   sigma  = sqrt(sum_t w_t^2) / sum_t w_t with w_t the exact softmax weights: 1 for one dominant
//            token, 1 / sqrt(n) for n equal logits. Independent per-weight rounding errors of
//            relative size e move the output by about e * sigma * R (a random walk over the tokens).
//   Lam    = max_t |s_t| + |m| (natural units): the size of the numbers the fp32 logit and
//            exponent arithmetic rounds.
//   C      = the logit soft-cap c (0: none): its approximate exp2 and reciprocal move each logit
//            by up to ~4.5 u c (kernels/decode_math.hpp, softcap2), each weight by as much of itself.
// The contract (per path, constants in contract()): with u = 2^-24,
//   |out - ref| <= out_round + R * (c_w * sigma + c_s * u * Lam + c_c * u * C + c_a * u * sqrt(n / 16))
// where out_round is half an ulp of the output dtype at max(|out|, |ref|) (0 for fp32 partials),
// c_w the per-weight relative error of the path's weights (derived in docs/design.md), c_s the
// logit term, c_c the soft-cap's and c_a the fp32 accumulation of the weighted sum (one rounding per
// 16 tokens); the weight terms add in quadrature and scale with the weights' spread (sigma).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/numeric.hpp"
#include "gtest/gtest.h"
#include "test_util.hpp"

namespace dgtest::numerics {

using decodegraph::AttentionSpec;
using decodegraph::DecodeArgs;
using decodegraph::DType;
using decodegraph::KVLayout;

// ---------------------------------------------------------------- the float64 partition reference

/// Element offsets of K / V[block, kv_head, token, d], spelled out from types.hpp.
struct Strides {
  KVLayout layout;
  int64_t H, D, B, x;
  int64_t k(int64_t blk, int64_t h, int64_t t, int64_t d) const {
    if (layout == KVLayout::kNHD) return ((blk * B + t) * H + h) * D + d;
    return (((blk * H + h) * (D / x) + d / x) * B + t) * x + d % x;
  }
  int64_t v(int64_t blk, int64_t h, int64_t t, int64_t d) const {
    if (layout == KVLayout::kNHD) return ((blk * B + t) * H + h) * D + d;
    return ((blk * H + h) * D + d) * B + t;
  }
};

/// One (sequence, query head, partition): the exact partial state and the contract's scales.
struct Part {
  int n = 0;             // tokens
  double m = 0, l = 0;   // max logit (natural units), sum exp(s - m)
  double sigma = 0, lam = 0;
  double span = 0;       // max - min logit
  double cap = 0;        // the soft-cap c (natural units; 0: none)
  double wmax = 0;       // the largest weight's share, max_t w_t / sum_t w_t
  std::vector<double> o, R;  // normalised output, max_t |v_t[d]|
  std::vector<double> spread;  // sqrt(sum_t w_t^2 (v_t[d] - o[d])^2) / sum_t w_t
  std::vector<double> prefix;  // A: max over t of |sum_{t' <= t} w_t' v_t'[d]| / sum_t w_t
};

/// Every partition of every (sequence, query head), indexed like the V2 workspace:
/// (seq * num_q_heads + head) * max_partitions + part. partition_size >= max_seq_len gives the V1
/// (whole sequence) view. Padded rows (length 0) have no partitions (n = 0).
struct Reference {
  int heads = 0, max_partitions = 0, hs = 0;
  std::vector<Part> parts;
  const Part& at(int seq, int head, int part) const {
    return parts[(static_cast<std::size_t>(seq) * heads + head) * max_partitions + part];
  }
};

/// Element `idx` of a cache of a.spec as the kernels must read it: the model dtype's value, or an fp8
/// code's value (dgtest::fp8_value, spelled out from the bit fields) times the KV head's scale.
inline double cache_value(const DecodeArgs& a, const void* cache, int64_t idx, const float* scale, int kv_head) {
  const AttentionSpec& s = a.spec;
  if (!s.fp8_kv()) return decodegraph::load_as_float(s.dtype, cache, idx);
  return dgtest::fp8_value(s.kv_dtype, static_cast<const uint8_t*>(cache)[idx]) *
         double(scale[s.kv_scale_per_head ? kv_head : 0]);
}

inline Reference reference_partitions(const DecodeArgs& a, int partition_size) {
  const AttentionSpec& s = a.spec;
  const int hs = s.head_size, bs = s.block_size, group = s.num_q_heads / s.num_kv_heads;
  const DType dt = s.dtype;
  const Strides st{s.layout, s.num_kv_heads, hs, bs, static_cast<int64_t>(16 / s.kv_elem_size())};
  const double scale = s.scale > 0.0f ? double(s.scale) : 1.0 / std::sqrt(double(hs));
  Reference r;
  r.heads = s.num_q_heads;
  r.hs = hs;
  r.max_partitions = (a.max_seq_len + partition_size - 1) / partition_size;
  r.parts.resize(static_cast<std::size_t>(a.num_seqs) * r.heads * r.max_partitions);
  const int64_t q_row = a.q_stride != 0 ? a.q_stride : int64_t{s.num_q_heads} * hs;
  std::vector<double> q(hs), logit;
  for (int seq = 0; seq < a.num_seqs; ++seq) {
    const int len = a.seq_lens[seq];
    const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
    for (int h = 0; h < s.num_q_heads; ++h) {
      const int kvh = h / group;
      for (int d = 0; d < hs; ++d) q[d] = decodegraph::load_as_float(dt, a.q, seq * q_row + int64_t{h} * hs + d);
      const double slope = a.alibi_slopes ? double(a.alibi_slopes[h]) : 0.0;
      const double cap = s.logit_softcap;
      for (int p = 0; p * partition_size < len; ++p) {
        Part& part = r.parts[(static_cast<std::size_t>(seq) * r.heads + h) * r.max_partitions + p];
        const int t0 = p * partition_size, t1 = std::min(len, t0 + partition_size);
        part.n = t1 - t0;
        logit.assign(part.n, 0.0);
        part.m = -INFINITY;
        for (int t = t0; t < t1; ++t) {
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += q[d] * cache_value(a, a.k_cache, st.k(table[t / bs], kvh, t % bs, d), a.k_scale, kvh);
          logit[t - t0] = dot * scale + slope * double(t - len + 1);
          if (cap > 0) logit[t - t0] = cap * std::tanh(logit[t - t0] / cap);
          part.m = std::max(part.m, logit[t - t0]);
        }
        double l = 0, l2 = 0, lam = 0, lo = INFINITY;
        part.o.assign(hs, 0.0);
        part.R.assign(hs, 0.0);
        for (int t = t0; t < t1; ++t) {
          const double w = std::exp(logit[t - t0] - part.m);
          l += w;
          l2 += w * w;
          if (std::isfinite(logit[t - t0])) {  // a -inf logit (weight 0) rounds nothing
            lam = std::max(lam, std::fabs(logit[t - t0]));
            lo = std::min(lo, logit[t - t0]);
          }
          for (int d = 0; d < hs; ++d) {
            const double v = cache_value(a, a.v_cache, st.v(table[t / bs], kvh, t % bs, d), a.v_scale, kvh);
            part.o[d] += w * v;
            part.R[d] = std::max(part.R[d], std::fabs(v));
          }
        }
        for (double& o : part.o) o /= l;
        part.spread.assign(hs, 0.0);
        part.prefix.assign(hs, 0.0);
        std::vector<double> run(hs, 0.0);
        for (int t = t0; t < t1; ++t) {
          const double w = std::exp(logit[t - t0] - part.m);
          for (int d = 0; d < hs; ++d) {
            const double v = cache_value(a, a.v_cache, st.v(table[t / bs], kvh, t % bs, d), a.v_scale, kvh);
            part.spread[d] += w * w * (v - part.o[d]) * (v - part.o[d]);
            run[d] += w * v;
            part.prefix[d] = std::max(part.prefix[d], std::fabs(run[d]));
          }
        }
        for (double& x : part.spread) x = std::sqrt(x) / l;
        for (double& x : part.prefix) x /= l;
        part.l = l;
        part.sigma = std::sqrt(l2) / l;
        part.wmax = 1.0 / l;  // the max logit's weight is exp(0) = 1
        part.lam = lam + std::fabs(part.m);
        part.span = part.m - lo;
        part.cap = cap;
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------- the contract

/// The paths of the pass-1 math, as the launcher selects them (decode_policy.hpp,
/// pass1_uses_tensor_cores): tensor cores for fp16 / bf16 with GQA groups >= 4, CUDA cores otherwise.
/// fp8 caches run on tensor cores at every group, with fp16 operands (compute_dtype).
enum class Path { kCudaCores, kTensorCores };
inline Path path_of(const AttentionSpec& s) {
  if (s.fp8_kv()) return Path::kTensorCores;
  return s.dtype != DType::kFloat32 && s.num_q_heads / s.num_kv_heads >= 4 ? Path::kTensorCores : Path::kCudaCores;
}
/// The dtype the path rounds its weights to: the model dtype, fp16 for fp8 caches.
inline DType compute_dtype(const AttentionSpec& s) { return s.fp8_kv() ? DType::kFloat16 : s.dtype; }
inline const char* to_string(Path p) { return p == Path::kTensorCores ? "tensor cores" : "CUDA cores"; }

/// The contract's constants of one path (header comment; docs/design.md derives them): the
/// standard deviations of its error sources, and the limits on the normalised error z.
struct Contract {
  double w;      // rms relative error of one weight (the path's rounding of P, ex2.approx)
  double s;      // rms relative weight error from the fp32 logit arithmetic, per unit of u * Lam
  double cap;    // rms relative weight error from the soft-cap's arithmetic, per unit of u * C
  double a;      // rms accumulation error, per unit of u * sqrt(n) * A
  double max_z;  // every element: z <= max_z
  double rms_z;  // every case: rms of z over its elements <= rms_z
  double min_correctly_rounded;  // share of fp16 / bf16 outputs equal to the correctly rounded value
};
inline Contract contract(Path p, DType dt) {
  const double ex2 = 1.75e-7;  // ex2.approx: 2 ulp with a random sign
  double w = ex2, acc = 0.3;
  if (p == Path::kTensorCores) {
    // hi / lo split in the model dtype (measured over 2M weights 2^-12 .. 1: bf16 rms 2.45e-6, max
    // 7.6e-6 = 2^-17; fp16 (scaled by 2^15) rms 4.4e-8, max 1.2e-7); two accumulations (hi, lo).
    const double split = dt == DType::kBFloat16 ? 2.45e-6 : 4.4e-8;
    w = std::sqrt(split * split + ex2 * ex2);
    acc = 0.85;
  }
  // The soft-cap (decode_math.hpp, softcap2): the base-2 logit moves by 2 cap2 r (e / (e + 1) ex2's
  // error - rcp's + the rounding of e + 1) plus the fma's rounding, r = 1 / (e + 1). At random signs
  // (ex2 2 ulp: 2.9 u rms, rcp 1 ulp: 1.5 u) that is at most ~3.2 u cap2 rms (r -> 1), i.e. 3.2 u C
  // of each weight (ln 2 cap2 = C); at most ~6.5 u cap2 = 4.5 u C.
  return Contract{w, 0.4, 3.3, acc, 6.0, 1.0, 0.95};
}
inline constexpr double kU = 5.9604644775390625e-08;  // 2^-24

/// The standard deviation of one element's error (header comment), without the output rounding.
inline double deviation(const Contract& c, const Part& p, int d) {
  const double w = c.w * p.spread[d];
  const double s = c.s * kU * p.lam * p.spread[d];
  const double k = c.cap * kU * p.cap * p.spread[d];
  const double a = c.a * kU * std::sqrt(double(p.n)) * p.prefix[d];
  return std::sqrt(w * w + s * s + k * k + a * a);
}

inline double ulp_of(DType dt, double x) {
  const int bits = dt == DType::kFloat32 ? 24 : dt == DType::kFloat16 ? 11 : 8;
  x = std::fabs(x);
  if (dt == DType::kFloat16 && x < 6.103515625e-05) return std::ldexp(1.0, -24);  // subnormal spacing
  if (x == 0) return dt == DType::kFloat32 ? std::ldexp(1.0, -149) : std::ldexp(1.0, -133);
  int e;
  std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - bits);
}
/// ref rounded to dtype (round to nearest even), as a double.
inline double round_to(DType dt, double ref) {
  const float f = static_cast<float>(ref);
  switch (dt) {
    case DType::kFloat32: return f;
    case DType::kFloat16: return decodegraph::fp16_bits_to_float(decodegraph::float_to_fp16_bits(f));
    case DType::kBFloat16: return decodegraph::bf16_bits_to_float(decodegraph::float_to_bf16_bits(f));
  }
  return f;
}

/// What one comparison measured. e = |out - ref| minus the output's own rounding (half an ulp of
/// the output dtype; none for the fp32 partials); z = e / deviation.
struct Measure {
  Contract c{};
  std::size_t n = 0, correctly_rounded = 0, nan = 0, over = 0;
  double max_abs = 0;     // max |out - ref|
  double max_over_R = 0;  // max e / R
  double max_z = 0, sum_z2 = 0;
  std::string worst;      // where max_z was reached
  double share() const { return n ? double(correctly_rounded) / double(n) : 1.0; }
  double rms_z() const { return n ? std::sqrt(sum_z2 / double(n)) : 0.0; }
  void add(DType dt, double out, double ref, const Part& p, int d, bool rounded_output, const std::string& where) {
    ++n;
    if (std::isnan(out)) {
      ++nan;
      ++over;
      max_abs = max_over_R = max_z = sum_z2 = INFINITY;
      worst = where + " NaN";
      return;
    }
    const double err = std::fabs(out - ref);
    const double out_round = rounded_output ? 0.5 * ulp_of(dt, std::max(std::fabs(out), std::fabs(ref))) : 0.0;
    if (out == round_to(dt, ref)) ++correctly_rounded;
    max_abs = std::max(max_abs, err);
    const double e = std::max(0.0, err - out_round);
    if (p.R[d] > 0) max_over_R = std::max(max_over_R, e / p.R[d]);
    const double dev = deviation(c, p, d);
    const double z = dev > 0 ? e / dev : (e > 0 ? INFINITY : 0.0);
    sum_z2 += z * z;
    if (z > c.max_z) ++over;
    if (z > max_z) {
      max_z = z;
      std::ostringstream w;
      w << where << ": out " << out << " ref " << ref << " |err| " << err << " deviation " << dev << " (R " << p.R[d]
        << ", spread " << p.spread[d] << ", prefix " << p.prefix[d] << ", lam " << p.lam << ", n " << p.n << ")";
      worst = w.str();
    }
  }
  /// The contract's checks on this comparison: every z, the rms of z, and for fp16 / bf16
  /// outputs the correctly rounded share.
  ::testing::AssertionResult holds(DType out_dtype, bool rounded_output) const {
    std::ostringstream why;
    if (nan) why << nan << " NaN; ";
    if (over) why << over << " of " << n << " elements above " << c.max_z << " deviations (worst z " << max_z << " at " << worst << "); ";
    if (rms_z() > c.rms_z) why << "rms z " << rms_z() << " above " << c.rms_z << " (worst at " << worst << "); ";
    if (rounded_output && out_dtype != DType::kFloat32 && share() < c.min_correctly_rounded)
      why << "correctly rounded share " << share() << " below " << c.min_correctly_rounded << "; ";
    if (why.str().empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << why.str();
  }
};

/// Compares a dtype output [num_seqs, num_q_heads, head_size] (packed rows) with the V1 view of
/// the reference (partition_size >= max_seq_len).
inline Measure measure_output(const DecodeArgs& a, const Reference& ref, const void* out) {
  Measure m;
  m.c = contract(path_of(a.spec), compute_dtype(a.spec));
  const int H = a.spec.num_q_heads, hs = a.spec.head_size;
  for (int seq = 0; seq < a.num_seqs; ++seq) {
    if (a.seq_lens[seq] == 0) continue;
    for (int h = 0; h < H; ++h) {
      const Part& p = ref.at(seq, h, 0);
      for (int d = 0; d < hs; ++d) {
        const std::size_t i = (static_cast<std::size_t>(seq) * H + h) * hs + d;
        m.add(a.spec.dtype, decodegraph::load_as_float(a.spec.dtype, out, i), p.o[d], p, d, true,
              "seq " + std::to_string(seq) + " head " + std::to_string(h) + " d " + std::to_string(d));
      }
    }
  }
  return m;
}

/// The V2 partials of a workspace against the reference partitions: partial_out (fp32, no output
/// rounding), and the max logits and exp sums as relative errors.
struct PartialMeasure {
  Measure o;
  double max_m_err = 0;  // |m - ref_m| / (max(1, lam) + 1.5 C): in units of the logits' own size
  double max_l_rel = 0;  // |l - ref_l| / ref_l / (lam + 4 sqrt(n) + 4 C): in units of u
  /// m within 4 u of the logits' size (two roundings of the base-2 logit and the ln 2 back) plus
  /// the soft-cap's 6 u C; l within 1.5 u (lam + 4 sqrt(n)) plus 6 u C: the logits' rounding moves
  /// every weight by up to ~u lam (and the cap's by 4.5 u C), the sum of n weights adds ~u sqrt(n).
  ::testing::AssertionResult holds() const {
    if (max_m_err <= 4 * kU && max_l_rel <= 1.5 * kU) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "max logit error " << max_m_err / kU << " u (allowed 4), exp sum error "
                                         << max_l_rel / kU << " u (lam + 4 sqrt(n)) (allowed 1.5)";
  }
};
inline PartialMeasure measure_partials(const DecodeArgs& a, const Reference& ref, int partition_size,
                                       const void* workspace) {
  const auto w = decodegraph::v2_workspace_layout(a.spec, a.num_seqs, a.max_seq_len, partition_size);
  const auto* b = static_cast<const unsigned char*>(workspace);
  const auto* ml = reinterpret_cast<const float*>(b + w.max_logits_offset);
  const auto* es = reinterpret_cast<const float*>(b + w.exp_sums_offset);
  const auto* po = reinterpret_cast<const float*>(b + w.partial_out_offset);
  PartialMeasure pm;
  pm.o.c = contract(path_of(a.spec), compute_dtype(a.spec));
  const int H = a.spec.num_q_heads, hs = a.spec.head_size;
  for (int seq = 0; seq < a.num_seqs; ++seq)
    for (int h = 0; h < H; ++h)
      for (int p = 0; p * partition_size < a.seq_lens[seq]; ++p) {
        const Part& r = ref.at(seq, h, p);
        const std::size_t idx = (static_cast<std::size_t>(seq) * H + h) * w.max_partitions + p;
        pm.max_m_err = std::max(pm.max_m_err, std::fabs(ml[idx] - r.m) / (std::max(1.0, r.lam) + 1.5 * r.cap));
        // l is relative to the kernel's own max: rescale the reference to it.
        const double l_ref = r.l * std::exp(r.m - double(ml[idx]));
        pm.max_l_rel = std::max(pm.max_l_rel,
                                std::fabs(es[idx] - l_ref) / l_ref / (r.lam + 4 * std::sqrt(double(r.n)) + 4 * r.cap));
        for (int d = 0; d < hs; ++d)
          pm.o.add(DType::kFloat32, po[idx * hs + d], r.o[d], r, d, false,
                   "seq " + std::to_string(seq) + " head " + std::to_string(h) + " part " + std::to_string(p) +
                       " d " + std::to_string(d));
      }
  return pm;
}

}  // namespace dgtest::numerics

namespace dgtest::numerics {

// ---------------------------------------------------------------- host model against the device

/// The host implementation models the device math per path (host_attention.cpp): its outputs and
/// V2 partials equal the device's to fp32 noise: `rel` relatively, plus the fp32 rounding of the
/// same sums in another order (sum_order * u * sqrt(n) of the accumulated magnitude A: the host
/// adds each weighted row at once, the tensor cores add 16 tokens' hi, then lo), plus, on the
/// tensor-core path, one weight whose split rounds the other way (host and device weights differ
/// by ~1e-7, so one weight in ~2^(split bits - 23) straddles a rounding point of its lo part):
/// `flip` times that weight's share (at most the largest, wmax) times 2R, plus the fp32 rounding
/// of the logits themselves (each side forms ALiBi terms and dot products in its own order: a
/// weight moves by up to `logit` u Lam relatively; over the tokens that adds 4 logit u Lam spread to
/// an output). Per partition: m within rel of max(1, |m|), the mass l e^m (what the merge weighs;
/// l alone is relative to each side's own max) within rel + sum_order u sqrt(n) + flip wmax +
/// logit u Lam, partial_out within the element's bound.
/// The dtype outputs are equal or within the larger of one ulp and the same bound; of the fp16 /
/// bf16 ones at most `max_differing` differ at all.
struct ModelCheck {
  double rel = 1e-6;
  double sum_order = 4.0;
  double flip = 0;  // split_flip(path, dtype)
  double logit = 2.0;
  double max_differing = 0.01;
};
/// A lo part's rounding step relative to its weight: 2^-16 (bf16), 2^-22 (fp16); 0 off the
/// tensor cores (fp32 weights).
inline double split_flip(Path p, DType dt) {
  if (p != Path::kTensorCores) return 0.0;
  return dt == DType::kBFloat16 ? std::ldexp(1.0, -16) : std::ldexp(1.0, -22);
}
inline ModelCheck model_check(const AttentionSpec& s) {
  ModelCheck mc;
  mc.flip = split_flip(path_of(s), compute_dtype(s));
  return mc;
}

inline ::testing::AssertionResult outputs_match(const DecodeArgs& a, const Reference& ref, const void* host,
                                                const void* device, const ModelCheck& mc = {}) {
  const DType dt = a.spec.dtype;
  const int H = a.spec.num_q_heads, hs = a.spec.head_size;
  std::size_t n = 0, differing = 0, bad = 0;
  std::ostringstream first;
  for (int seq = 0; seq < a.num_seqs; ++seq) {
    if (a.seq_lens[seq] == 0) continue;
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < hs; ++d) {
        const std::size_t i = (static_cast<std::size_t>(seq) * H + h) * hs + d;
        const double x = decodegraph::load_as_float(dt, host, i), y = decodegraph::load_as_float(dt, device, i);
        ++n;
        if (x == y) continue;
        if (dt != DType::kFloat32) ++differing;
        const Part& r = ref.at(seq, h, 0);
        const double noise = mc.rel * r.R[d] + mc.sum_order * kU * std::sqrt(double(r.n)) * r.prefix[d] +
                             mc.flip * r.wmax * 2 * r.R[d] + 4 * mc.logit * kU * r.lam * r.spread[d];
        const double allowed = dt == DType::kFloat32 ? noise : std::max(noise, ulp_of(dt, std::max(std::fabs(x), std::fabs(y))));
        if (!(std::fabs(x - y) <= allowed)) {
          if (bad++ < 5) first << "  seq " << seq << " head " << h << " d " << d << ": host " << x << " device " << y << "\n";
        }
      }
  }
  if (bad == 0 && double(differing) <= mc.max_differing * double(n)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differing << " of " << n << " outputs differ (at most " << mc.max_differing * n
                                       << " may), " << bad << " by more than allowed\n"
                                       << first.str();
}

inline ::testing::AssertionResult partials_match(const DecodeArgs& a, const Reference& ref, int partition_size,
                                                 const void* host_ws, const void* device_ws, const ModelCheck& mc = {}) {
  const auto w = decodegraph::v2_workspace_layout(a.spec, a.num_seqs, a.max_seq_len, partition_size);
  auto view = [&](const void* ws, std::size_t off) {
    return reinterpret_cast<const float*>(static_cast<const unsigned char*>(ws) + off);
  };
  const float *hm = view(host_ws, w.max_logits_offset), *dm = view(device_ws, w.max_logits_offset);
  const float *hl = view(host_ws, w.exp_sums_offset), *dl = view(device_ws, w.exp_sums_offset);
  const float *ho = view(host_ws, w.partial_out_offset), *dout = view(device_ws, w.partial_out_offset);
  const int H = a.spec.num_q_heads, hs = a.spec.head_size;
  double worst_m = 0, worst_l = 0, worst_o = 0;
  std::size_t bad = 0;
  std::ostringstream first;
  for (int seq = 0; seq < a.num_seqs; ++seq)
    for (int h = 0; h < H; ++h)
      for (int p = 0; p * partition_size < a.seq_lens[seq]; ++p) {
        const std::size_t idx = (static_cast<std::size_t>(seq) * H + h) * w.max_partitions + p;
        const Part& r = ref.at(seq, h, p);
        const double order = mc.sum_order * kU * std::sqrt(double(r.n));
        const double em = std::fabs(double(hm[idx]) - dm[idx]) / std::max(1.0, std::fabs(double(hm[idx])));
        const double mass = double(hl[idx]) * std::exp(double(hm[idx]) - dm[idx]);
        const double el = std::fabs(mass - dl[idx]) / dl[idx];
        worst_m = std::max(worst_m, em);
        worst_l = std::max(worst_l, el);
        bool ok = em <= mc.rel && el <= mc.rel + order + mc.flip * r.wmax + mc.logit * kU * r.lam;
        for (int d = 0; d < hs; ++d) {
          const double diff = std::fabs(double(ho[idx * hs + d]) - dout[idx * hs + d]);
          worst_o = std::max(worst_o, diff / r.R[d]);
          ok = ok && diff <= mc.rel * r.R[d] + order * r.prefix[d] + mc.flip * r.wmax * 2 * r.R[d] +
                            4 * mc.logit * kU * r.lam * r.spread[d];
        }
        if (!ok && bad++ < 5)
          first << "  seq " << seq << " head " << h << " part " << p << ": m " << hm[idx] << " / " << dm[idx] << ", l "
                << hl[idx] << " / " << dl[idx] << "\n";
      }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " partitions differ beyond fp32 noise (worst: m " << worst_m
                                       << ", mass l e^m " << worst_l << ", partial_out " << worst_o << " of R)\n"
                                       << first.str();
}

}  // namespace dgtest::numerics
