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
// The contract (per path, constants in contract()): with u = 2^-24,
//   |out - ref| <= out_round + R * (c_w * sigma + c_s * u * Lam + c_a * u * sqrt(n / 16))
// where out_round is half an ulp of the output dtype at max(|out|, |ref|) (0 for fp32 partials),
// c_w the per-weight relative error of the path's weights (derived in docs/design.md), c_s the
// logit term and c_a the fp32 accumulation of the weighted sum (one rounding per 16 tokens).
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
  std::vector<double> o, R;  // normalised output, max_t |v_t[d]|
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

inline Reference reference_partitions(const DecodeArgs& a, int partition_size) {
  const AttentionSpec& s = a.spec;
  const int hs = s.head_size, bs = s.block_size, group = s.num_q_heads / s.num_kv_heads;
  const DType dt = s.dtype;
  const Strides st{s.layout, s.num_kv_heads, hs, bs, static_cast<int64_t>(16 / decodegraph::dtype_size(dt))};
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
      for (int p = 0; p * partition_size < len; ++p) {
        Part& part = r.parts[(static_cast<std::size_t>(seq) * r.heads + h) * r.max_partitions + p];
        const int t0 = p * partition_size, t1 = std::min(len, t0 + partition_size);
        part.n = t1 - t0;
        logit.assign(part.n, 0.0);
        part.m = -INFINITY;
        for (int t = t0; t < t1; ++t) {
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += q[d] * decodegraph::load_as_float(dt, a.k_cache, st.k(table[t / bs], kvh, t % bs, d));
          logit[t - t0] = dot * scale + slope * double(t - len + 1);
          part.m = std::max(part.m, logit[t - t0]);
        }
        double l = 0, l2 = 0, lam = 0, lo = INFINITY;
        part.o.assign(hs, 0.0);
        part.R.assign(hs, 0.0);
        for (int t = t0; t < t1; ++t) {
          const double w = std::exp(logit[t - t0] - part.m);
          l += w;
          l2 += w * w;
          lam = std::max(lam, std::fabs(logit[t - t0]));
          lo = std::min(lo, logit[t - t0]);
          for (int d = 0; d < hs; ++d) {
            const double v = decodegraph::load_as_float(dt, a.v_cache, st.v(table[t / bs], kvh, t % bs, d));
            part.o[d] += w * v;
            part.R[d] = std::max(part.R[d], std::fabs(v));
          }
        }
        for (double& o : part.o) o /= l;
        part.l = l;
        part.sigma = std::sqrt(l2) / l;
        part.lam = lam + std::fabs(part.m);
        part.span = part.m - lo;
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------- the contract

/// The paths of the pass-1 math, as the launcher selects them (decode_policy.hpp,
/// pass1_uses_tensor_cores): tensor cores for fp16 / bf16 with GQA groups >= 4, CUDA cores otherwise.
enum class Path { kCudaCores, kTensorCores };
inline Path path_of(const AttentionSpec& s) {
  return s.dtype != DType::kFloat32 && s.num_q_heads / s.num_kv_heads >= 4 ? Path::kTensorCores : Path::kCudaCores;
}
inline const char* to_string(Path p) { return p == Path::kTensorCores ? "tensor cores" : "CUDA cores"; }

/// The contract's constants of one path (header comment). docs/design.md derives them.
struct Contract {
  double c_w, c_s, c_a;
  double min_correctly_rounded;  // share of dtype outputs equal to the correctly rounded value
};
inline Contract contract(Path p, DType dt) {
  (void)p;
  (void)dt;
  return Contract{0, 0, 0, 0};
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

/// What one comparison measured.
struct Measure {
  std::size_t n = 0, correctly_rounded = 0, nan = 0;
  double max_abs = 0;       // max |out - ref|
  double max_over_R = 0;    // max (|out - ref| - out_round) / R
  double max_ulps = 0;      // max |out - ref| / ulp_dtype(ref)
  double max_sigma = 0;     // max (|out - ref| - out_round) / (R * sigma)
  std::string worst;        // where max_over_R was reached
  double share() const { return n ? double(correctly_rounded) / double(n) : 1.0; }
  void add(DType dt, double out, double ref, double R, double sigma, bool rounded_output, const std::string& where) {
    ++n;
    if (std::isnan(out)) {
      ++nan;
      max_abs = max_over_R = max_ulps = max_sigma = INFINITY;
      worst = where + " NaN";
      return;
    }
    const double err = std::fabs(out - ref);
    const double out_round = rounded_output ? 0.5 * ulp_of(dt, std::max(std::fabs(out), std::fabs(ref))) : 0.0;
    if (out == round_to(dt, ref)) ++correctly_rounded;
    max_abs = std::max(max_abs, err);
    max_ulps = std::max(max_ulps, err / ulp_of(dt, ref));
    const double e = std::max(0.0, err - out_round);
    if (R > 0 && e / R > max_over_R) {
      max_over_R = e / R;
      std::ostringstream w;
      w << where << ": out " << out << " ref " << ref << " R " << R << " sigma " << sigma;
      worst = w.str();
    }
    if (R > 0 && sigma > 0) max_sigma = std::max(max_sigma, e / (R * sigma));
  }
};

/// Compares a dtype output [num_seqs, num_q_heads, head_size] (packed rows) with the V1 view of
/// the reference (partition_size >= max_seq_len).
inline Measure measure_output(const DecodeArgs& a, const Reference& ref, const void* out) {
  Measure m;
  const int H = a.spec.num_q_heads, hs = a.spec.head_size;
  for (int seq = 0; seq < a.num_seqs; ++seq) {
    if (a.seq_lens[seq] == 0) continue;
    for (int h = 0; h < H; ++h) {
      const Part& p = ref.at(seq, h, 0);
      for (int d = 0; d < hs; ++d) {
        const std::size_t i = (static_cast<std::size_t>(seq) * H + h) * hs + d;
        m.add(a.spec.dtype, decodegraph::load_as_float(a.spec.dtype, out, i), p.o[d], p.R[d], p.sigma, true,
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
  double max_m_err = 0;  // |m - ref_m| / max(1, lam)
  double max_l_rel = 0;  // |l - ref_l| / ref_l
};
inline PartialMeasure measure_partials(const DecodeArgs& a, const Reference& ref, int partition_size,
                                       const void* workspace) {
  const auto w = decodegraph::v2_workspace_layout(a.spec, a.num_seqs, a.max_seq_len, partition_size);
  const auto* b = static_cast<const unsigned char*>(workspace);
  const auto* ml = reinterpret_cast<const float*>(b + w.max_logits_offset);
  const auto* es = reinterpret_cast<const float*>(b + w.exp_sums_offset);
  const auto* po = reinterpret_cast<const float*>(b + w.partial_out_offset);
  PartialMeasure pm;
  const int H = a.spec.num_q_heads, hs = a.spec.head_size;
  for (int seq = 0; seq < a.num_seqs; ++seq)
    for (int h = 0; h < H; ++h)
      for (int p = 0; p * partition_size < a.seq_lens[seq]; ++p) {
        const Part& r = ref.at(seq, h, p);
        const std::size_t idx = (static_cast<std::size_t>(seq) * H + h) * w.max_partitions + p;
        pm.max_m_err = std::max(pm.max_m_err, std::fabs(ml[idx] - r.m) / std::max(1.0, r.lam));
        // l is relative to the kernel's own max: rescale the reference to it.
        const double l_ref = r.l * std::exp(r.m - double(ml[idx]));
        pm.max_l_rel = std::max(pm.max_l_rel, std::fabs(es[idx] - l_ref) / l_ref);
        for (int d = 0; d < hs; ++d)
          pm.o.add(DType::kFloat32, po[idx * hs + d], r.o[d], r.R[d], r.sigma, false,
                   "seq " + std::to_string(seq) + " head " + std::to_string(h) + " part " + std::to_string(p) +
                       " d " + std::to_string(d));
      }
  return pm;
}

}  // namespace dgtest::numerics
