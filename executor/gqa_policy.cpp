// The V1/V2 (GQA) kernel policy (gqa_plan.hpp): which launch a bucket gets. Partition sizes are
// whole cache blocks, balanced so that no partition is a sliver. kThreshold runs V1 up to the
// threshold and V2 above it at the fill rule's partition size (enough blocks to fill the resident
// slots at the design length); kAuto scores V1 and a ladder of V2 sizes with the cost model and
// keeps the least worst-case regret over the band; kMeasured starts from kAuto's choice and times
// it against its neighbours (measure.cpp). docs/planning.md explains the rules; the numbers in its
// examples come from this file.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/executor.hpp"
#include "executor/cost_model.hpp"
#include "executor/gqa_plan.hpp"
#include "executor/plan.hpp"

namespace decodegraph {

// ---------------------------------------------------------------- partition size

namespace {

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }
long long round_up(long long a, long long b) { return ceil_div(a, b) * b; }

/// The fill rule's minimum partition (kThreshold, balanced_partition_size): ~256 tokens, a whole
/// number of cache blocks, below which that rule does not look at what partitions cost.
long long min_partition(int block_size) { return round_up(256, block_size); }

/// kAuto's shortest candidate: 64 tokens (4 tiles of 16), rounded up to the block size; for a short
/// planned length (a window, or a band up to kShortPlannedLen) one cache block, so that a window can
/// be split over as many blocks as it has cache blocks (issue 31, item 5). Elsewhere shorter
/// partitions only help where 64 already gives every resident slot a block at batch 1; the cost
/// model weighs the merge, the partials and each block's fixed cost against the stream they split.
constexpr long long kShortPlannedLen = 1024;
long long auto_min_partition(int block_size, long long planned_hi) {
  return planned_hi <= kShortPlannedLen ? block_size : round_up(64, block_size);
}

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

// ---------------------------------------------------------------- the fill rule

using detail::blocks_per_partition;
using detail::pass1_slots;

namespace {

/// The fill rule's partition size for a V2 bucket (kThreshold's; or the caller's fixed one): the
/// longest balanced P that gives target_blocks blocks at the design length.
int fill_v2_partition(const BucketPlan& p, const ExecutorConfig& c) {
  if (c.partition_size != 0) return c.partition_size;
  const long long need = ceil_div(pass1_slots(c, p.q_len), blocks_per_partition(c.spec, p.batch, p.q_len));
  return balanced_partition_size(p.design_len, static_cast<int>(std::min<long long>(need, 1 << 30)),
                                 c.spec.block_size);
}

}  // namespace

// ---------------------------------------------------------------- the policies

namespace detail {

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
  const std::array<int, 3> lens = band_lengths(c, p);
  const long long min_p = auto_min_partition(bs, lens[2]);
  const long long hi = lens[2];
  const long long longest = round_up(hi, bs);  // one partition at the upper edge
  const long long per = blocks_per_partition(c.spec, p.batch, p.q_len);
  const long long slots = pass1_slots(c, p.q_len);
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
    const long long min_p = auto_min_partition(bs, planned_hi(c, p));
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

}  // namespace detail

int auto_partition_size(const AttentionSpec& spec, int batch, int band_hi, int num_sms) {
  validate_spec(spec);
  require(batch >= 1, "batch", batch, ">= 1");
  require(band_hi >= 1, "band_hi", band_hi, ">= 1");
  require(num_sms >= 1, "num_sms", num_sms, ">= 1");
  const long long target = static_cast<long long>(num_sms) * host_device_model(spec).blocks_per_sm;
  const long long need = ceil_div(target, blocks_per_partition(spec, batch));
  return balanced_partition_size(std::max(1, band_hi / 2), static_cast<int>(need), spec.block_size);
}

}  // namespace decodegraph
