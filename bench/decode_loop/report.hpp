// The run's report, apart from the sections with files of their own (bands, policies, capture
// costs, checks): the header (machine, defaults, shape), the executor's plan, the captures and
// memory, and the whole run as one JSON document.
#pragma once

#include <string>
#include <vector>

#include "backend.hpp"
#include "bands.hpp"
#include "capture_compare.hpp"
#include "check.hpp"
#include "policies.hpp"
#include "run_loop.hpp"
#include "setup.hpp"

namespace dgloop {

/// "backend: ..." and, on CUDA, the measured bandwidths.
std::string machine_report(const Machine& m, bool gpu);
/// The defaults used, the shape and the size of the caches.
std::string run_header(const Setup& s);
/// The device model, the band choice and every bucket's plan, as the executor has them.
std::string executor_report(const Setup& s, const dg::Executor& ex);
/// The capture statistics (per graph), memory and step counts.
std::string captures_report(const Setup& s, const dg::ExecutorStats& stats, const dg::MemoryReport& mem,
                            double capture_wall_ms);

/// Everything the run's JSON document holds.
struct RunReport {
  const Setup& s;
  const Machine& machine;
  const dg::Executor& ex;
  const std::vector<PolicyRow>& policies;
  const std::vector<BandRow>& bands;
  const std::vector<VerifyRow>& verify;
  const dg::ExecutorStats& stats;
  const dg::MemoryReport& mem;
  const std::vector<CaptureCost>& costs;
  const LoopResults& loop;
  const StepTotals& totals;
};
json run_json(const RunReport& r);

}  // namespace dgloop
