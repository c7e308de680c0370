// The plan book (plan_book.hpp).
#include "executor/plan_book.hpp"

#include "decodegraph/error.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace decodegraph::detail {

PlanBook::PlanBook(const ExecutorConfig& c, LayerGroups groups)
    : groups_(std::move(groups)),
      band_edges_(c.band_edges),
      q_lens_(c.q_lens),
      num_batch_buckets_(static_cast<int>(c.batch_buckets.size())),
      num_buckets_(static_cast<int>(c.q_lens.size() * c.batch_buckets.size())),
      num_bands_(static_cast<int>(c.band_edges.size())) {
  for (int g = 0; g < groups_.size(); ++g) {
    group_configs_.push_back(groups_.planning_config(c, g));
    std::vector<BucketPlan> plans = make_plans(group_configs_.back());
    for (BucketPlan& p : plans) p.group = g;
    plans_.insert(plans_.end(), std::make_move_iterator(plans.begin()), std::make_move_iterator(plans.end()));
  }
  bucket_of_batch_.assign(c.max_batch + 1, 0);
  for (int n = 1, b = 0; n <= c.max_batch; ++n) {
    while (c.batch_buckets[b] < n) ++b;
    bucket_of_batch_[n] = b;
  }
  // Graph ids follow the cells' first use of each step launch; make_plans' per-group ids are
  // replaced (with one group they are the same). kMeasured joins a cell once it is measured.
  for (std::size_t cell = 0; cell < num_cells(); ++cell)
    if (plan(cell).graph_id >= 0) join(cell);
}

int PlanBook::q_index(int q_len) const {
  const auto it = std::find(q_lens_.begin(), q_lens_.end(), q_len);
  return it == q_lens_.end() ? -1 : static_cast<int>(it - q_lens_.begin());
}

int PlanBook::band_of_length(int len) const {
  return static_cast<int>(std::lower_bound(band_edges_.begin(), band_edges_.end(), len) - band_edges_.begin());
}

void PlanBook::join(std::size_t cell) {
  std::vector<LaunchKey> key;
  for (int g = 0; g < num_groups(); ++g) key.push_back(launch_key(group_plan(g, cell)));
  const auto [it, fresh] = launch_of_key_.emplace(std::move(key), static_cast<int>(launches_.size()));
  if (fresh) {
    Launch l;
    for (int g = 0; g < num_groups(); ++g) {
      l.plans.push_back(group_plan(g, cell));
      l.plans.back().graph_id = it->second;
      l.plans.back().candidates.clear();
    }
    launches_.push_back(std::move(l));
  }
  Launch& l = launches_[static_cast<std::size_t>(it->second)];
  l.buckets.push_back(cell);
  for (int g = 0; g < num_groups(); ++g) {
    BucketPlan& p = group_plan(g, cell);
    BucketPlan& lp = l.plans[static_cast<std::size_t>(g)];
    lp.band = std::min(lp.band, p.band);
    lp.band_lo = std::min(lp.band_lo, p.band_lo);
    lp.band_hi = std::max(lp.band_hi, p.band_hi);
    p.graph_id = it->second;
  }
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
  for (int g = 0; g < num_groups(); ++g)
    for (int band = 0; band < num_bands_; ++band) {
      const BucketPlan& b = group_plan(g, index(bucket, band));
      p.launch_len = std::max(p.launch_len, b.launch_len);
      p.workspace_bytes = std::max(p.workspace_bytes, b.workspace_bytes);
    }
  return p;
}

int PlanBook::branch_key(int group, int bucket, int band) const {
  const LaunchKey key = launch_key(group_plan(group, index(bucket, band)));
  int first = 0;
  while (launch_key(group_plan(group, index(bucket, first))) != key) ++first;
  return first;
}

std::size_t PlanBook::workspace_bytes() const {
  std::size_t bytes = 0;
  for (const BucketPlan& p : plans_) {
    bytes = std::max(bytes, p.workspace_bytes);
    for (const PlanCandidate& cand : p.candidates)
      if (cand.kernel == KernelKind::kV2)
        bytes = std::max(bytes, v2_workspace_size(groups_[p.group].spec, p.batch, p.band_hi, cand.partition_size, p.q_len));
  }
  return bytes;
}

void check_group(const PlanBook& book, int group) {
  if (group < 0 || group >= book.num_groups())
    throw_invalid("group", group, "a layer group 0.." + std::to_string(book.num_groups() - 1));
}

std::string plan_table_text(const PlanBook& book) {
  std::string s;
  if (book.num_groups() > 1)
    for (int g = 0; g < book.num_groups(); ++g) s += describe_layer_group(g, book.groups()[g]) + "\n";
  return s + format_plan_table(book.plans());
}

}  // namespace decodegraph::detail
