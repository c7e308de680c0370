// The checks of the run: each layer's graph output against its eager output (bitwise on a GPU,
// within the dtype's tolerance on the host backend), the graph output against the float64
// reference (host backend), and their summary lines.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bands.hpp"

namespace dgloop {

struct Tolerance {
  double atol, rtol;
};
/// Host backend: eager (host::) against graph replay (recorded host::) -- the same code, so any
/// difference beyond rounding of the output dtype is a bug. Also used against the float64 reference.
Tolerance tolerance_for(dg::DType t);

/// One layer's graph output against its eager output.
struct OutputDiff {
  bool same = true;  // bitwise
  double worst = 0;  // max |graph - eager| (infinite where either is NaN)
  std::size_t worst_i = 0;
  bool out_of_tol = false;
};
OutputDiff compare_outputs(dg::DType dtype, const void* graph, const void* eager, std::size_t elems, Tolerance tol);

/// What the checks found over the run.
struct CheckSummary {
  std::vector<std::string> mismatches;  // the first five, for the failure report
  long mismatch_steps = 0;              // layer-steps where graph and eager disagree
  int ref_checks = 0;
  double ref_max_err = 0;
  bool ref_failed = false;
  /// Host backend: tokens whose appended K/V were looked up at their position (every layer, step and
  /// row), and the first that was not there.
  long long append_checks = 0;
  std::string append_failure;

  void add_mismatch(std::string what);
};

/// Graph output `out` (host memory) against the float64 reference of `a`; adds to the summary.
void check_reference(const dg::DecodeArgs& a, const void* out, std::size_t elems, Tolerance tol, CheckSummary& sum);

/// The graph step's appends of one layer (host memory): every token's K/V at its position
/// (dgbench::appended_kv_mismatch); adds to the summary.
void check_appended(const dg::AttentionSpec& spec, const void* k_cache, const void* v_cache, const float* k_scale,
                    const float* v_scale, const void* key, const void* value, const int32_t* seq_lens,
                    const int32_t* tables, int stride, int num_seqs, int q_len, const std::string& where,
                    CheckSummary& sum);

/// Over all steps: how many were bitwise equal, and the largest |diff|.
struct StepTotals {
  int bitwise_steps = 0;
  double max_diff = 0;
};
StepTotals step_totals(const std::vector<StepRecord>& recs);

/// The "check:" lines of the text output.
std::string check_report(const CheckSummary& sum, const StepTotals& totals, std::size_t steps, int layers,
                         bool checked, bool gpu, Tolerance tol);

}  // namespace dgloop
