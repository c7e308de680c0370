// The plans as text: the name of a plan's reason, the sentence that explains it (describe_reason),
// and the plan table (format_plan_table), one row per plan, as Executor::plan_table() and
// decode_loop --plan-only print it. docs/planning.md, "Reading the plans", explains the columns.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "decodegraph/executor.hpp"

namespace decodegraph {

const char* to_string(PlanReason reason) {
  switch (reason) {
    case PlanReason::kAboveThreshold: return "above_threshold";
    case PlanReason::kThresholdRule: return "threshold_rule";
    case PlanReason::kMeasuredFastest: return "measured_fastest";
    case PlanReason::kNotMeasured: return "not_measured";
    case PlanReason::kLeastRegret: return "least_regret";
  }
  return "unknown";
}

namespace {
std::string describe_choice(const BucketPlan& p) {
  char b[256];
  switch (p.reason) {
    case PlanReason::kLeastRegret:
      std::snprintf(b, sizeof b,
                    "predicted time: least worst-case regret (%+.1f %%) of %d candidates; %.1f / %.1f / %.1f us at "
                    "%d / %d / %d tokens",
                    100 * p.predicted_regret, p.candidates_scored, p.predicted_lo.us, p.predicted_mid.us,
                    p.predicted_hi.us, p.predicted_lo.len, p.predicted_mid.len, p.predicted_hi.len);
      break;
    case PlanReason::kAboveThreshold:
      std::snprintf(b, sizeof b, "threshold rule: V2 above the threshold, P fills %d slots at %d tokens",
                    p.target_blocks, p.design_len);
      break;
    case PlanReason::kThresholdRule:
      std::snprintf(b, sizeof b, "threshold rule: V1 up to the threshold");
      break;
    case PlanReason::kNotMeasured:
      std::snprintf(b, sizeof b, "not measured yet: kAuto's choice for now");
      break;
    case PlanReason::kMeasuredFastest: {
      // Each candidate's measured time beside the model's prediction for it.
      std::string s = "measured fastest of";
      for (const PlanCandidate& c : p.candidates) {
        char one[96];
        if (c.kernel == KernelKind::kV1)
          std::snprintf(one, sizeof one, " v1 %.1f us (model %.1f)", c.us, c.predicted_us);
        else
          std::snprintf(one, sizeof one, " v2/P%d %.1f us (model %.1f)", c.partition_size, c.us, c.predicted_us);
        s += one;
        if (&c != &p.candidates.back()) s += ",";
      }
      return s;
    }
    default: std::snprintf(b, sizeof b, "unknown");
  }
  return b;
}
}  // namespace

std::string describe_reason(const BucketPlan& p) {
  std::string s = describe_choice(p);
  if (p.window > 0 && p.window < p.band_hi) {
    char w[96];
    std::snprintf(w, sizeof w, "; window %d: planned for min(L, %d) tokens", p.window, p.window);
    s += w;
  }
  return s;
}

std::string format_plan_table(const std::vector<BucketPlan>& plans) {
  std::ostringstream os;
  // A group column only where the plans are of several layer groups: one spec's table is unchanged.
  const bool groups = std::any_of(plans.begin(), plans.end(), [](const BucketPlan& p) { return p.group != 0; });
  // An n (q_len) column only where some plan has q_len > 1: a table of q_len 1 is unchanged.
  const bool qlens = std::any_of(plans.begin(), plans.end(), [](const BucketPlan& p) { return p.q_len != 1; });
  char line[640];
  if (groups) os << "group ";
  if (qlens) os << " n ";
  std::snprintf(line, sizeof line, "%6s %5s %15s %6s %6s %6s %16s %10s %10s %7s %7s %8s %6s %8s %22s %14s %6s  %s\n",
                "batch", "band", "lengths", "kernel", "P", "parts", "grid (x,y,z)", "merge", "workspace", "blocks",
                "target", "live@lo", "waves", "pred us", "loop/fixed/merge/launch", "roof% lo/mid/hi", "graph", "why");
  os << line;
  for (const BucketPlan& p : plans) {
    char lengths[40], grid[40], merge[40], part[16], graph[16], roof[40], split[64];
    std::snprintf(lengths, sizeof lengths, "(%d,%d]", p.band_lo, p.band_hi);
    std::snprintf(grid, sizeof grid, "%d,%d,%d", p.grid_x, p.grid_y, p.grid_z);
    std::snprintf(roof, sizeof roof, "%.0f/%.0f/%.0f", 100 * p.predicted_lo.roof_share, 100 * p.predicted_mid.roof_share,
                  100 * p.predicted_hi.roof_share);
    // pred us at the upper edge, broken down (docs/planning.md, "The cost model").
    const PlanPrediction& hi = p.predicted_hi;
    std::snprintf(split, sizeof split, "%.1f/%.1f/%.1f/%.1f", hi.loop_us, hi.fixed_us, hi.merge_us, hi.launch_us);
    const bool v2 = p.kernel == KernelKind::kV2;
    if (v2) {
      std::snprintf(merge, sizeof merge, "%d,%d,%d", p.merge_grid_x, p.merge_grid_y, p.merge_grid_z);
      std::snprintf(part, sizeof part, "%d", p.partition_size);
    } else {
      std::snprintf(merge, sizeof merge, "-");
      std::snprintf(part, sizeof part, "-");
    }
    if (p.graph_id >= 0)
      std::snprintf(graph, sizeof graph, "%d", p.graph_id);
    else
      std::snprintf(graph, sizeof graph, "-");
    if (groups) {
      char g[16];
      std::snprintf(g, sizeof g, "%5d ", p.group);
      os << g;
    }
    if (qlens) {
      char n[16];
      std::snprintf(n, sizeof n, "%2d ", p.q_len);
      os << n;
    }
    std::snprintf(line, sizeof line, "%6d %5d %15s %6s %6s %6d %16s %10s %10zu %7d %7d %8d %6.2f %8.1f %22s %14s %6s  %s\n",
                  p.batch, p.band, lengths, to_string(p.kernel), part, p.max_partitions, grid, merge, p.workspace_bytes,
                  p.blocks, p.target_blocks, p.live_blocks_at_band_lo, p.waves, p.predicted_hi.us, split, roof, graph,
                  describe_reason(p).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace decodegraph
