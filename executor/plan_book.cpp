// The plan book (plan_book.hpp).
#include "executor/plan_book.hpp"

#include <algorithm>

namespace decodegraph::detail {

PlanBook::PlanBook(const ExecutorConfig& c)
    : plans_(make_plans(c)),
      band_edges_(c.band_edges),
      num_buckets_(static_cast<int>(c.batch_buckets.size())),
      num_bands_(static_cast<int>(c.band_edges.size())) {
  bucket_of_batch_.assign(c.max_batch + 1, 0);
  for (int n = 1, b = 0; n <= c.max_batch; ++n) {
    while (c.batch_buckets[b] < n) ++b;
    bucket_of_batch_[n] = b;
  }
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (plans_[i].graph_id >= 0) join(i);  // kMeasured joins a bucket once it is measured
}

int PlanBook::band_of_length(int len) const {
  return static_cast<int>(std::lower_bound(band_edges_.begin(), band_edges_.end(), len) - band_edges_.begin());
}

void PlanBook::join(std::size_t idx) {
  BucketPlan& p = plans_[idx];
  const auto [it, fresh] = launch_of_key_.emplace(launch_key(p), static_cast<int>(launches_.size()));
  if (fresh) {
    Launch l;
    l.plan = p;
    l.plan.graph_id = it->second;
    l.plan.candidates.clear();
    launches_.push_back(std::move(l));
  }
  Launch& l = launches_[static_cast<std::size_t>(it->second)];
  l.buckets.push_back(idx);
  l.plan.band = std::min(l.plan.band, p.band);
  l.plan.band_lo = std::min(l.plan.band_lo, p.band_lo);
  l.plan.band_hi = std::max(l.plan.band_hi, p.band_hi);
  p.graph_id = it->second;
}

bool PlanBook::bucket_decided(int bucket) const {
  for (int band = 0; band < num_bands_; ++band)
    if (plan(bucket, band).graph_id < 0) return false;
  return true;
}

BucketPlan PlanBook::bucket_graph_plan(int bucket) const {
  BucketPlan p = plan(bucket, num_bands_ - 1);
  p.candidates.clear();
  p.band = 0;
  p.band_lo = 0;
  p.graph_id = bucket;
  for (int band = 0; band < num_bands_; ++band) {
    p.launch_len = std::max(p.launch_len, plan(bucket, band).launch_len);
    p.workspace_bytes = std::max(p.workspace_bytes, plan(bucket, band).workspace_bytes);
  }
  return p;
}

std::size_t PlanBook::workspace_bytes(const AttentionSpec& spec) const {
  std::size_t bytes = 0;
  for (const BucketPlan& p : plans_) {
    bytes = std::max(bytes, p.workspace_bytes);
    for (const PlanCandidate& cand : p.candidates)
      if (cand.kernel == KernelKind::kV2)
        bytes = std::max(bytes, v2_workspace_size(spec, p.batch, p.band_hi, cand.partition_size));
  }
  return bytes;
}

}  // namespace decodegraph::detail
