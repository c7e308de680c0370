// The plan book (internal): every plan, per (layer group, q_len, batch bucket, band), and the
// distinct launches buckets share. A *bucket* here is one (q_len, batch bucket) pair, index q *
// batch buckets + batch bucket (q: the q_len's index in ExecutorConfig::q_lens; with one q_len the
// batch bucket index itself); the public BucketIndex is the batch bucket alone. A *cell* is one
// (bucket, band), index bucket * bands + band; each
// layer group has its own plan of every cell, and a step's launches are every group's plans of its
// cell. Under BandSelect::kHost each distinct step launch (every group's launch identical) is one
// graph; under kDevice a cell is one branch of the SWITCH nodes, and the bands whose launches are
// identical for the layer's group record it once per node. kMeasured decides a cell (every group's
// plan) when it is measured (join), so launches grow; everything else is decided at construction.
// Host-only.
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/layer_groups.hpp"
#include "executor/plan.hpp"

namespace decodegraph::detail {

class PlanBook {
 public:
  /// One distinct step launch: every layer group's launch of the cells that share it.
  struct Launch {
    std::vector<BucketPlan> plans;  // [group]: its launch plan; band fields span the cells
    std::vector<std::size_t> buckets;  // cells, in the order they joined
    double measure_ms = 0;             // kMeasured: timing the candidates of the cells that chose it
    /// Group 0's: what StepContext::plan() says and GraphStats describes.
    const BucketPlan& plan() const { return plans.front(); }
  };

  /// Every group's make_plans (with its planning config), and every decided cell joined to its launch.
  PlanBook(const ExecutorConfig& resolved, LayerGroups groups);

  const LayerGroups& groups() const { return groups_; }
  int num_groups() const { return groups_.size(); }
  /// What group g is planned with (LayerGroups::planning_config): set_launch and kMeasured's
  /// candidates take it.
  const ExecutorConfig& group_config(int group) const { return group_configs_[static_cast<std::size_t>(group)]; }

  /// (q_len, batch bucket) pairs: num_q_lens() x num_batch_buckets().
  int num_buckets() const { return num_buckets_; }
  int num_batch_buckets() const { return num_batch_buckets_; }
  int num_q_lens() const { return static_cast<int>(q_lens_.size()); }
  /// The index of `q_len` in ExecutorConfig::q_lens, or -1 when it is not captured.
  int q_index(int q_len) const;
  /// The bucket of batch bucket `batch_bucket` at q_len index `q`.
  int bucket(int q, int batch_bucket) const { return q * num_batch_buckets_ + batch_bucket; }
  /// The batch bucket (the public BucketIndex) and q_len of bucket `bucket`.
  int batch_bucket_of(int bucket) const { return bucket % num_batch_buckets_; }
  int q_len_of(int bucket) const { return q_lens_[static_cast<std::size_t>(bucket / num_batch_buckets_)]; }
  int num_bands() const { return num_bands_; }
  std::size_t num_cells() const { return static_cast<std::size_t>(num_buckets_) * num_bands_; }
  /// Cell of (bucket, band): bucket-major. With one group, also the index into plans().
  std::size_t index(int bucket, int band) const {
    return static_cast<std::size_t>(bucket) * num_bands_ + band;
  }
  /// The batch bucket of a step of `num_seqs` sequences (1..max_batch).
  int bucket_of_batch(int num_seqs) const { return bucket_of_batch_[num_seqs]; }
  /// The bucket of a step of `num_seqs` sequences (1..max_batch) and a captured q_len.
  int bucket_of_step(int num_seqs, int q_len) const { return bucket(q_index(q_len), bucket_of_batch(num_seqs)); }
  /// The band of a step whose lengths (or hint) reach `len`: the first band edge >= len.
  int band_of_length(int len) const;

  /// Every plan, group-major: group * cells + cell.
  std::vector<BucketPlan>& plans() { return plans_; }
  const std::vector<BucketPlan>& plans() const { return plans_; }
  std::span<const BucketPlan> group_plans(int group) const {
    return std::span<const BucketPlan>(plans_).subspan(static_cast<std::size_t>(group) * num_cells(), num_cells());
  }
  /// Group `group`'s plan of cell `cell`.
  BucketPlan& group_plan(int group, std::size_t cell) { return plans_[static_cast<std::size_t>(group) * num_cells() + cell]; }
  const BucketPlan& group_plan(int group, std::size_t cell) const {
    return plans_[static_cast<std::size_t>(group) * num_cells() + cell];
  }
  /// Group 0's plan of a cell: its band, batch and graph_id are every group's.
  const BucketPlan& plan(std::size_t cell) const { return group_plan(0, cell); }
  const BucketPlan& plan(int bucket, int band) const { return plan(index(bucket, band)); }

  const std::vector<Launch>& launches() const { return launches_; }
  Launch& launch(int id) { return launches_[static_cast<std::size_t>(id)]; }
  /// Assigns cell `cell` (every group's plan decided) to the launch of its groups' launch keys,
  /// making a new launch the first time they are seen, and sets every group's graph_id.
  void join(std::size_t cell);
  /// Whether every band of `bucket` has its launch (kMeasured: has been measured).
  bool bucket_decided(int bucket) const;
  /// What StepContext::plan() says while a kDevice bucket graph is recorded: group 0's plan of the
  /// bucket's longest band, spanning every band (band 0 .. the last, lengths (0, max_seq_len]), with
  /// the longest launch_len and largest workspace of any group's branch; graph_id = bucket (q *
  /// batch buckets + batch bucket).
  BucketPlan bucket_graph_plan(int bucket) const;
  /// kDevice: names group `group`'s launch in band `band` of `bucket` among the bucket's bands (the
  /// first band whose launch is identical), so a SWITCH node records identical bands once.
  int branch_key(int group, int bucket, int band) const;
  /// V2 workspace for every plan and every candidate kMeasured may time, of any group.
  std::size_t workspace_bytes() const;

 private:
  LayerGroups groups_;
  std::vector<ExecutorConfig> group_configs_;
  std::vector<BucketPlan> plans_;  // group-major: group * cells + cell
  std::vector<int> band_edges_;
  std::vector<int> q_lens_;
  int num_batch_buckets_ = 0;
  int num_buckets_ = 0;
  int num_bands_ = 0;
  std::vector<int> bucket_of_batch_;  // [max_batch + 1]
  std::vector<Launch> launches_;
  std::map<std::vector<LaunchKey>, int> launch_of_key_;
};

/// Throws InvalidArgument unless 0 <= group < the book's layer groups.
void check_group(const PlanBook& book, int group);
/// Executor::plan_table(): format_plan_table of every plan; with several layer groups, one line per
/// group first (describe_layer_group).
std::string plan_table_text(const PlanBook& book);

}  // namespace decodegraph::detail
