// The plan book (internal): every bucket's plan, and the distinct launches buckets share. Under
// BandSelect::kHost each launch is one graph; under kDevice it is one branch identity of the SWITCH
// nodes (bands with the same launch record it once). kMeasured decides a bucket's launch when it is
// measured (join), so launches grow; everything else is decided at construction. Host-only.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/plan.hpp"

namespace decodegraph::detail {

class PlanBook {
 public:
  /// One distinct launch sequence.
  struct Launch {
    BucketPlan plan;  // the launch plan; band fields span its buckets (StepContext::plan)
    std::vector<std::size_t> buckets;  // plan indices, in the order they joined
    double measure_ms = 0;             // kMeasured: timing the candidates of the buckets that chose it
  };

  /// make_plans(resolved), and every decided plan joined to its launch.
  explicit PlanBook(const ExecutorConfig& resolved);

  int num_buckets() const { return num_buckets_; }
  int num_bands() const { return num_bands_; }
  /// Index of (bucket, band) in plans(): bucket-major.
  std::size_t index(int bucket, int band) const {
    return static_cast<std::size_t>(bucket) * num_bands_ + band;
  }
  /// The batch bucket of a step of `num_seqs` sequences (1..max_batch).
  int bucket_of_batch(int num_seqs) const { return bucket_of_batch_[num_seqs]; }
  /// The band of a step whose lengths (or hint) reach `len`: the first band edge >= len.
  int band_of_length(int len) const;

  std::vector<BucketPlan>& plans() { return plans_; }
  const std::vector<BucketPlan>& plans() const { return plans_; }
  BucketPlan& plan(std::size_t idx) { return plans_[idx]; }
  const BucketPlan& plan(std::size_t idx) const { return plans_[idx]; }
  const BucketPlan& plan(int bucket, int band) const { return plans_[index(bucket, band)]; }

  const std::vector<Launch>& launches() const { return launches_; }
  Launch& launch(int id) { return launches_[static_cast<std::size_t>(id)]; }
  /// Assigns plan `idx` to the launch of its launch key, making a new launch the first time a key
  /// is seen, and sets its graph_id.
  void join(std::size_t idx);
  /// Whether every band of `bucket` has its launch (kMeasured: has been measured).
  bool bucket_decided(int bucket) const;
  /// What StepContext::plan() says while a kDevice bucket graph is recorded: the bucket's batch,
  /// every band (band 0 .. the last, lengths (0, max_seq_len]), the longest launch_len and largest
  /// workspace of its branches, and the longest band's kernel and partitions; graph_id = bucket.
  BucketPlan bucket_graph_plan(int bucket) const;
  /// V2 workspace for every plan and every candidate kMeasured may time.
  std::size_t workspace_bytes(const AttentionSpec& spec) const;

 private:
  std::vector<BucketPlan> plans_;  // bucket-major: bucket * num_bands + band
  std::vector<int> band_edges_;
  int num_buckets_ = 0;
  int num_bands_ = 0;
  std::vector<int> bucket_of_batch_;  // [max_batch + 1]
  std::vector<Launch> launches_;
  std::map<LaunchKey, int> launch_of_key_;
};

}  // namespace decodegraph::detail
