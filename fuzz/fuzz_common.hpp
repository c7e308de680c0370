// Helpers shared by the libFuzzer targets: zeroed KV caches for a config, a check that aborts with a
// message (a finding), and the float64 reference of a finished host step and the comparison with it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/executor.hpp"
#include "decodegraph/numeric.hpp"

namespace dgfuzz {

using namespace decodegraph;

/// An invariant broke: report and abort so libFuzzer records the input.
[[noreturn]] inline void finding(const char* what, long long a = 0, long long b = 0) {
  std::fprintf(stderr, "FUZZ FINDING: %s (%lld, %lld)\n", what, a, b);
  std::abort();
}
inline void check(bool ok, const char* what, long long a = 0, long long b = 0) {
  if (!ok) finding(what, a, b);
}

/// 16-byte aligned zeroed storage.
struct Storage {
  std::vector<std::uint64_t> words;
  explicit Storage(std::size_t bytes = 0) : words(bytes / 8 + 2, 0) {}
  void* data() { return words.data(); }
};

/// |out - ref| <= atol + rtol*|ref| with the per-dtype tolerances of tests/reliability for inputs in
/// [-1, 1], scaled for inputs in [-amp, amp]: outputs grow with amp (atol * amp) and so do logits,
/// whose fp32 rounding (~1e-7 * |logit|) perturbs the softmax weights; for fp32, the only dtype where
/// that term dominates, atol grows with amp^2 (|logit| ~ amp^2).
inline bool close(DType dt, double out, double ref, double amp) {
  const double base = dt == DType::kFloat32 ? 2e-5 : dt == DType::kFloat16 ? 2e-3 : 1e-2;
  const double rtol = dt == DType::kFloat32 ? 1e-4 : base;
  const double atol = dt == DType::kFloat32 ? base * amp * amp : base * amp;
  return std::fabs(out - ref) <= atol + rtol * std::fabs(ref);
}

/// The float64 reference over `args` (rows [0, num_seqs)), computed once per step and layer: the
/// step's output, host V1 and host V2 are all compared with the same one.
inline std::vector<double> reference_of(const DecodeArgs& args) {
  const std::size_t row = static_cast<std::size_t>(args.spec.num_q_heads) * args.spec.head_size;
  std::vector<double> ref(args.num_seqs * row, 0.0);
  try {
    reference::paged_attention(args, ref.data());
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    finding("the reference rejected arguments the step accepted");
  }
  return ref;
}

/// Compares rows [0, num_seqs) of out (dtype) with ref, the float64 reference over the same arguments.
inline void check_against_reference(const DecodeArgs& args, const std::vector<double>& ref, const void* out,
                                    double amp, const char* what) {
  const std::size_t row = static_cast<std::size_t>(args.spec.num_q_heads) * args.spec.head_size;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (args.seq_lens[i / row] == 0) continue;  // a padded row: left untouched, whatever it held
    const double o = load_as_float(args.spec.dtype, out, i);
    if (!close(args.spec.dtype, o, ref[i], amp)) {
      std::fprintf(stderr, "element %zu: out %.8g ref %.8g (dtype %s, amp %g, scale %g)\n", i, o, ref[i],
                   to_string(args.spec.dtype), amp, args.spec.effective_scale());
      finding(what, static_cast<long long>(i / row), static_cast<long long>(i % row));
    }
  }
}

}  // namespace dgfuzz
