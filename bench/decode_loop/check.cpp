#include "check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bench_common.hpp"

namespace dgloop {

Tolerance tolerance_for(dg::DType t) {
  switch (t) {
    case dg::DType::kBFloat16: return {2e-2, 2e-2};  // bf16: 8 mantissa bits, eps 7.8e-3
    case dg::DType::kFloat16: return {4e-3, 4e-3};   // fp16: eps 9.8e-4
    case dg::DType::kFloat32: return {1e-4, 1e-4};
  }
  return {0, 0};
}

OutputDiff compare_outputs(dg::DType dtype, const void* graph, const void* eager, std::size_t elems, Tolerance tol) {
  OutputDiff d;
  d.same = std::memcmp(graph, eager, elems * dg::dtype_size(dtype)) == 0;
  for (std::size_t i = 0; i < elems && !d.same; ++i) {
    const double g = dg::load_as_float(dtype, graph, i);
    const double e = dg::load_as_float(dtype, eager, i);
    const double diff = std::isnan(g) || std::isnan(e) ? INFINITY : std::fabs(g - e);
    if (diff > d.worst) d.worst = diff, d.worst_i = i;
    if (diff > tol.atol + tol.rtol * std::fabs(e)) d.out_of_tol = true;
  }
  return d;
}

void CheckSummary::add_mismatch(std::string what) {
  if (mismatches.size() < 5) mismatches.push_back(std::move(what));
  ++mismatch_steps;
}

void check_reference(const dg::DecodeArgs& a, const void* out, std::size_t elems, Tolerance tol, CheckSummary& sum) {
  std::vector<double> ref(elems);
  dg::reference::paged_attention(a, ref.data());
  for (std::size_t i = 0; i < elems; ++i) {
    const double g = dg::load_as_float(a.spec.dtype, out, i);
    const double d = std::isnan(g) ? INFINITY : std::fabs(g - ref[i]);
    sum.ref_max_err = std::max(sum.ref_max_err, d);
    if (d > tol.atol + tol.rtol * std::fabs(ref[i])) sum.ref_failed = true;
  }
  ++sum.ref_checks;
}

void check_appended(const dg::AttentionSpec& spec, const void* k_cache, const void* v_cache, const float* k_scale,
                    const float* v_scale, const void* key, const void* value, const int32_t* seq_lens,
                    const int32_t* tables, int stride, int num_seqs, int q_len, const std::string& where,
                    CheckSummary& sum) {
  const std::string miss = dgbench::appended_kv_mismatch(spec, k_cache, v_cache, k_scale, v_scale, key, value, seq_lens,
                                                         tables, stride, num_seqs, q_len);
  if (!miss.empty() && sum.append_failure.empty()) sum.append_failure = where + ": " + miss;
  sum.append_checks += static_cast<long long>(num_seqs) * q_len;
}

StepTotals step_totals(const std::vector<StepRecord>& recs) {
  StepTotals t;
  for (const auto& r : recs) {
    t.bitwise_steps += r.bitwise_equal ? 1 : 0;
    t.max_diff = std::max(t.max_diff, r.max_abs_diff);
  }
  return t;
}

std::string check_report(const CheckSummary& sum, const StepTotals& totals, std::size_t steps, int layers,
                         bool checked, bool gpu, Tolerance tol) {
  if (!checked) return "check: skipped (--no-check)\n";
  std::string s = fmt::format(
      "check: eager vs graph over {} steps x {} layers: {} steps bitwise equal, max |diff| {:.3g} ({})\n", steps,
      layers, totals.bitwise_steps, totals.max_diff,
      gpu ? "bitwise equality required" : fmt::format("tolerance atol {:.0e} rtol {:.0e}", tol.atol, tol.rtol));
  if (!gpu) {
    s += fmt::format("check: graph vs float64 reference (layer 0) at {} steps: max |err| {:.3g} ({})\n", sum.ref_checks,
                     sum.ref_max_err, sum.ref_failed ? "OUT OF TOLERANCE" : "within tolerance");
    s += fmt::format("check: the graph's KV append at every token's position (every step, row and layer): {} appends, {}\n",
                     sum.append_checks, sum.append_failure.empty() ? "all in the cache" : "MISSING: " + sum.append_failure);
  }
  return s;
}

}  // namespace dgloop
