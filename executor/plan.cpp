// Planning: the kernel and partition choice per bucket under a KernelPolicy, and which buckets share
// a graph. Everything shape-dependent is decided here, on the host, so that running a bucket only
// replays launches. The config it plans is checked first (config_checks.cpp). docs/planning.md
// explains the rules; the numbers in its examples come from this file.
#include "executor/plan.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "executor/cost_model.hpp"
#include "executor/device_model.hpp"
#include "executor/layer_groups.hpp"
#include "executor/plan_book.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_policy.hpp"
#include "kernels/merge_policy.hpp"

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

// ---------------------------------------------------------------- partition size

namespace {

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }
long long round_up(long long a, long long b) { return ceil_div(a, b) * b; }

/// The fill rule's minimum partition (kThreshold, balanced_partition_size): ~256 tokens, a whole
/// number of cache blocks, below which that rule does not look at what partitions cost.
long long min_partition(int block_size) { return round_up(256, block_size); }

/// kAuto's shortest candidate: 64 tokens (4 tiles of 16), rounded up to the block size. Shorter
/// partitions only help where 64 already gives every resident slot a block at batch 1; the cost model
/// weighs the merge, the partials and each block's fixed cost above it.
long long auto_min_partition(int block_size) { return round_up(64, block_size); }

/// The longest balanced P >= min_p that gives at least min_parts partitions of len (see below).
long long balanced_partition(long long len, long long min_parts, int block_size, long long min_p) {
  const long long want = std::max<long long>(min_parts, 1);
  for (long long k = want;; ++k) {
    const long long p = std::max(min_p, round_up(ceil_div(len, k), block_size));
    if (ceil_div(len, p) >= want || p == min_p) return p;
  }
}

}  // namespace

// P(k) = max(min, round_up(ceil(L / k), block_size)) is the even split of L into k partitions,
// rounded up to whole cache blocks: every partition but the last holds P tokens, at most one block
// more than the even share, and the last takes what is left (the seed's rule, the largest P that
// still gives enough partitions, left a sliver instead: 8176 + 8176 + 32). Rounding up can lose a
// partition (L = 32768, k = 83: P = 400 gives 82), so k grows from min_parts until P(k) gives at
// least min_parts; P(k) only shrinks as k grows, so this is the longest balanced P that does. At the
// minimum partition the search stops: that is the most partitions the minimum allows.
int balanced_partition_size(int design_len, int min_parts, int block_size) {
  require(design_len >= 1, "design_len", design_len, ">= 1");
  require(block_size >= 1, "block_size", block_size, ">= 1");
  return static_cast<int>(balanced_partition(design_len, min_parts, block_size, min_partition(block_size)));
}

// ---------------------------------------------------------------- plan helpers

namespace {

/// Pass-1 blocks per partition index: one per (sequence, KV head, head chunk), as the launcher maps
/// grid y (kernels::pass1_head_chunks).
long long blocks_per_partition(const AttentionSpec& spec, int batch) {
  return static_cast<long long>(batch) * spec.num_kv_heads * kernels::pass1_head_chunks_for(spec.group_size());
}

/// The fill rule's partition size for a V2 bucket (kThreshold's; or the caller's fixed one): the
/// longest balanced P that gives target_blocks blocks at the design length.
int fill_v2_partition(const BucketPlan& p, const ExecutorConfig& c) {
  if (c.partition_size != 0) return c.partition_size;
  const long long need = ceil_div(c.device_model.target_blocks(), blocks_per_partition(c.spec, p.batch));
  return balanced_partition_size(p.design_len, static_cast<int>(std::min<long long>(need, 1 << 30)),
                                 c.spec.block_size);
}

}  // namespace

namespace detail {

// ---------------------------------------------------------------- plans

// The band's own lengths, or for a windowed layer (window W), which reads min(L, W) tokens, each
// of them capped at W: the threshold's "above it always V2" then applies to that length, so a
// 128-token window runs V1 in every band.
PlannedLengths planned_lengths(const AttentionSpec& spec, int band_lo, int band_hi, int q_len) {
  PlannedLengths r;
  // The lower edge is band_lo + 1 tokens. The first band's is 1 token, where every launch is its
  // kernels' floors (and which asks for no partitions at all); it starts at half its upper edge
  // instead, where its lengths double as every other default band's do, so that its longer half
  // (which sets the step's time) is what is scored and split.
  r.lo = band_lo > 0 ? band_lo + 1 : std::max(1, band_hi / 2);
  r.mid = r.lo + (band_hi - r.lo + 1) / 2;
  r.hi = band_hi;
  r.design = band_lo > 0 ? band_lo : std::max(1, band_hi / 2);
  // q_len rows read from their first row's window on: W + q_len - 1 tokens.
  if (spec.sliding_window > 0)
    for (int* len : {&r.lo, &r.mid, &r.hi, &r.design}) *len = std::min(*len, math::read_window(spec.sliding_window, q_len));
  return r;
}

namespace {

/// The lengths a plan is scored at (kAuto) and predicted for: its group's planned lengths.
std::array<int, 3> band_lengths(const ExecutorConfig& c, const BucketPlan& p) {
  const PlannedLengths l = planned_lengths(c.spec, p.band_lo, p.band_hi, p.q_len);
  return {l.lo, l.mid, l.hi};
}

/// The longest length a plan of this bucket is chosen for: where the threshold applies.
int planned_hi(const ExecutorConfig& c, const BucketPlan& p) {
  return planned_lengths(c.spec, p.band_lo, p.band_hi, p.q_len).hi;
}

PlanPrediction prediction(const ExecutorConfig& c, const BucketPlan& p, int len) {
  const CostBreakdown b = predict_call(c, p, len);
  return PlanPrediction{len, b.us, b.roof_share};
}

}  // namespace

void set_launch(BucketPlan& p, const ExecutorConfig& c, KernelKind kernel, int partition_size) {
  const long long per_part = blocks_per_partition(c.spec, p.batch);
  p.kernel = kernel;
  p.grid_y = c.spec.num_kv_heads * kernels::pass1_head_chunks_for(c.spec.group_size());
  p.grid_z = p.batch;
  if (kernel == KernelKind::kV1) {
    // NOTE(graph): V1 launches are sized for the largest V1 band edge, not their own band_hi, so a
    // batch bucket's V1 launches are identical across bands and share a graph. The grid does not
    // depend on it; lengths are read from device memory and clamped to it, and max_blocks_per_seq
    // covers it (it is <= max_seq_len). A plan whose planned length is shorter than its band (a
    // window) may run V1 above the threshold: its launch still covers the band.
    p.launch_len = std::max(std::min(c.v2_threshold, c.max_seq_len), p.band_hi);
    p.partition_size = 0;
    p.max_partitions = 1;
    p.merge_grid_x = p.merge_grid_y = p.merge_grid_z = 0;
    p.workspace_bytes = 0;
  } else {
    p.launch_len = p.band_hi;
    p.partition_size = partition_size;
    // A window's partitions cover what it reads (its first block on), as the workspace does.
    // q_len rows read the window of their first row on: W + q_len - 1 tokens.
    p.max_partitions = num_partitions(
        math::window_read_max(p.band_hi, math::read_window(c.spec.sliding_window, p.q_len), c.spec.block_size),
        partition_size);
    p.merge_grid_x = c.spec.num_q_heads;  // one merge block per (query head, query row, 32 elements)
    p.merge_grid_y = p.batch * p.q_len;
    p.merge_grid_z = kernels::merge_slices(c.spec.head_size);
    p.workspace_bytes = v2_workspace_size(c.spec, p.batch, p.band_hi, partition_size, p.q_len);
  }
  p.grid_x = p.max_partitions;
  const long long live_parts = kernel == KernelKind::kV1 ? 1 : num_partitions(p.design_len, partition_size);
  p.blocks = static_cast<int>(p.grid_x * per_part);
  p.target_blocks = c.device_model.target_blocks();
  p.live_blocks_at_band_lo = static_cast<int>(live_parts * per_part);
  p.waves = static_cast<double>(p.blocks) / std::max(1, p.target_blocks);
  const std::array<int, 3> lens = band_lengths(c, p);
  p.predicted_lo = prediction(c, p, lens[0]);
  p.predicted_mid = prediction(c, p, lens[1]);
  p.predicted_hi = prediction(c, p, lens[2]);
  p.predicted_regret = 0;  // kAuto's choice sets these after its scoring
  p.candidates_scored = 0;
}

namespace {

/// kAuto's V2 partition sizes for a bucket: a ladder from the shortest candidate (64 tokens) in
/// doublings, one partition over the whole band, sizes that put at most 1-4 waves of
/// blocks at the upper edge (no partial last wave), sizes that give the lower edge enough streaming
/// blocks to reach the roof (once and twice), and the fill rule's. Sizes that launch more than
/// kMaxAutoWaves waves at the upper edge are left out: past a few waves more blocks only add their
/// fixed costs, partials and merge work (and the model's time grows with the waves). Ascending, unique.
constexpr long long kMaxAutoWaves = 16;

std::vector<int> auto_v2_sizes(const BucketPlan& p, const ExecutorConfig& c) {
  const int bs = c.spec.block_size;
  const long long min_p = auto_min_partition(bs);
  const std::array<int, 3> lens = band_lengths(c, p);
  const long long hi = lens[2];
  const long long longest = round_up(hi, bs);  // one partition at the upper edge
  const long long per = blocks_per_partition(c.spec, p.batch);
  const long long slots = c.device_model.target_blocks();
  const long long roof_blocks = static_cast<long long>(std::ceil(kCostConstants.read_gbs / kCostConstants.block_gbs));
  const long long max_blocks = kMaxAutoWaves * slots;
  std::set<long long> sizes;
  auto add = [&](long long q) {
    q = std::min(longest, std::max(min_p, round_up(q, bs)));
    if (q == longest || per * ceil_div(hi, q) <= max_blocks) sizes.insert(q);
  };
  for (long long q = min_p; q < longest; q *= 2) add(q);
  add(longest);
  for (long long waves = 1; waves <= 4; ++waves)
    if (waves * slots >= per) add(ceil_div(hi, waves * slots / per));
  for (long long m = 1; m <= 2; ++m)
    add(balanced_partition(lens[0], ceil_div(m * roof_blocks, per), bs, min_p));
  add(fill_v2_partition(p, c));
  return std::vector<int>(sizes.begin(), sizes.end());
}

}  // namespace

std::vector<ScoredPlan> auto_candidates(const BucketPlan& p, const ExecutorConfig& c) {
  std::vector<ScoredPlan> out;
  auto add = [&](KernelKind kernel, int size) {
    ScoredPlan s{p};
    set_launch(s.plan, c, kernel, size);
    out.push_back(std::move(s));
  };
  if (planned_hi(c, p) <= c.v2_threshold) add(KernelKind::kV1, 0);
  if (c.partition_size != 0)
    add(KernelKind::kV2, c.partition_size);
  else
    for (int size : auto_v2_sizes(p, c)) add(KernelKind::kV2, size);
  std::array<double, 3> best;
  best.fill(std::numeric_limits<double>::infinity());
  auto at = [](const BucketPlan& b, int i) { return i == 0 ? b.predicted_lo.us : i == 1 ? b.predicted_mid.us : b.predicted_hi.us; };
  for (const ScoredPlan& s : out)
    for (int i = 0; i < 3; ++i) best[i] = std::min(best[i], at(s.plan, i));
  for (ScoredPlan& s : out)
    for (int i = 0; i < 3; ++i) s.regret = std::max(s.regret, at(s.plan, i) / best[i] - 1);
  return out;
}

namespace {

/// The least worst-case regret; ties (within 1e-9) go to the shorter predicted time at the upper
/// edge, then to the earlier candidate (V1, then shorter partitions).
const ScoredPlan& least_regret(const std::vector<ScoredPlan>& scored, bool v2_only = false) {
  const ScoredPlan* best = nullptr;
  for (const ScoredPlan& s : scored) {
    if (v2_only && s.plan.kernel != KernelKind::kV2) continue;
    if (best == nullptr || s.regret < best->regret - 1e-9 ||
        (s.regret <= best->regret + 1e-9 && s.plan.predicted_hi.us < best->plan.predicted_hi.us - 1e-9))
      best = &s;
  }
  return *best;
}

}  // namespace

std::vector<PlanCandidate> measure_candidates(const BucketPlan& p, const ExecutorConfig& c) {
  std::vector<PlanCandidate> out;
  if (planned_hi(c, p) <= c.v2_threshold) out.push_back({KernelKind::kV1, 0, -1, -1});
  const int bs = c.spec.block_size;
  // kAuto's best V2, whichever kernel kAuto chose.
  const int auto_p = least_regret(auto_candidates(p, c), /*v2_only=*/true).plan.partition_size;
  std::vector<int> sizes = {auto_p};
  if (c.partition_size == 0) {
    const long long min_p = auto_min_partition(bs);
    const long long longest = round_up(planned_hi(c, p), bs);
    for (long long q : {static_cast<long long>(auto_p) / 2 / bs * bs, 2LL * auto_p})
      if (q >= min_p && q < longest && q != auto_p) sizes.push_back(static_cast<int>(q));
  }
  for (int s : sizes) out.push_back({KernelKind::kV2, s, -1, -1});
  for (PlanCandidate& k : out) {
    BucketPlan t = p;
    set_launch(t, c, k.kernel, k.partition_size);
    k.predicted_us = t.predicted_mid.us * c.num_layers;
  }
  return out;
}

LaunchKey launch_key(const BucketPlan& p) {
  return {static_cast<int>(p.kernel), p.batch,  p.q_len,  p.launch_len, p.partition_size,
          p.max_partitions,           p.grid_x, p.grid_y, p.workspace_bytes};
}

namespace {

/// The plan of one (q_len, batch bucket, band) under the config's policy.
BucketPlan make_plan(const ExecutorConfig& c, int q_len, int batch, int band) {
  BucketPlan p;
  p.batch = batch;
  p.q_len = q_len;
  p.band = band;
  p.band_lo = band == 0 ? 0 : c.band_edges[band - 1];
  p.band_hi = c.band_edges[band];
  p.design_len = planned_lengths(c.spec, p.band_lo, p.band_hi, q_len).design;
  p.window = c.spec.sliding_window;
  if (c.policy == KernelPolicy::kThreshold) {
    const bool v1 = planned_hi(c, p) <= c.v2_threshold;
    set_launch(p, c, v1 ? KernelKind::kV1 : KernelKind::kV2, v1 ? 0 : fill_v2_partition(p, c));
    p.reason = v1 ? PlanReason::kThresholdRule : PlanReason::kAboveThreshold;
  } else {
    const std::vector<ScoredPlan> scored = auto_candidates(p, c);
    const ScoredPlan& best = least_regret(scored);
    p = best.plan;
    p.predicted_regret = best.regret;
    p.candidates_scored = static_cast<int>(scored.size());
    p.reason = PlanReason::kLeastRegret;
  }
  if (c.policy == KernelPolicy::kMeasured) {
    p.candidates = measure_candidates(p, c);
    p.reason = PlanReason::kNotMeasured;  // kAuto's choice until the bucket is measured
  }
  return p;
}

}  // namespace

std::vector<BucketPlan> make_plans(const ExecutorConfig& c) {
  std::vector<BucketPlan> plans;
  plans.reserve(c.q_lens.size() * c.batch_buckets.size() * c.band_edges.size());
  for (const int q_len : c.q_lens)
    for (const int batch : c.batch_buckets)
      for (int band = 0; band < static_cast<int>(c.band_edges.size()); ++band)
        plans.push_back(make_plan(c, q_len, batch, band));
  if (c.policy != KernelPolicy::kMeasured) {
    std::map<LaunchKey, int> ids;
    for (BucketPlan& p : plans) p.graph_id = ids.emplace(launch_key(p), static_cast<int>(ids.size())).first->second;
  }
  return plans;
}

}  // namespace detail

std::vector<BucketPlan> plan_buckets(const ExecutorConfig& config) {
  ExecutorConfig c = detail::resolve_planning(config);
  c.device_model = detail::fill_device_model(c.device_model, detail::layer_spec(c, 0), host_device_model, "");
  return detail::PlanBook(c, detail::LayerGroups(c, config.device_model, host_device_model)).plans();
}

int auto_partition_size(const AttentionSpec& spec, int batch, int band_hi, int num_sms) {
  validate_spec(spec);
  require(batch >= 1, "batch", batch, ">= 1");
  require(band_hi >= 1, "band_hi", band_hi, ">= 1");
  require(num_sms >= 1, "num_sms", num_sms, ">= 1");
  const long long target = static_cast<long long>(num_sms) * host_device_model(spec).blocks_per_sm;
  const long long need = ceil_div(target, blocks_per_partition(spec, batch));
  return balanced_partition_size(std::max(1, band_hi / 2), static_cast<int>(need), spec.block_size);
}

// ---------------------------------------------------------------- output

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
  std::snprintf(line, sizeof line, "%6s %5s %15s %6s %6s %6s %16s %10s %10s %7s %7s %8s %6s %8s %14s %6s  %s\n",
                "batch", "band", "lengths", "kernel", "P", "parts", "grid (x,y,z)", "merge", "workspace", "blocks",
                "target", "live@lo", "waves", "pred us", "roof% lo/mid/hi", "graph", "why");
  os << line;
  for (const BucketPlan& p : plans) {
    char lengths[40], grid[40], merge[40], part[16], graph[16], roof[40];
    std::snprintf(lengths, sizeof lengths, "(%d,%d]", p.band_lo, p.band_hi);
    std::snprintf(grid, sizeof grid, "%d,%d,%d", p.grid_x, p.grid_y, p.grid_z);
    std::snprintf(roof, sizeof roof, "%.0f/%.0f/%.0f", 100 * p.predicted_lo.roof_share, 100 * p.predicted_mid.roof_share,
                  100 * p.predicted_hi.roof_share);
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
    std::snprintf(line, sizeof line, "%6d %5d %15s %6s %6s %6d %16s %10s %10zu %7d %7d %8d %6.2f %8.1f %14s %6s  %s\n",
                  p.batch, p.band, lengths, to_string(p.kernel), part, p.max_partitions, grid, merge, p.workspace_bytes,
                  p.blocks, p.target_blocks, p.live_blocks_at_band_lo, p.waves, p.predicted_hi.us, roof, graph,
                  describe_reason(p).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace decodegraph