// Recording a graph's work (internal): the step body, or each layer's KV append and attention, as
// the backend records it into the capture in progress, and StepContext, the body's view of it. Both
// graph caches and kMeasured build their launches here, so a launch is put together in one place.
//
// NOTE(graph): every pointer a recorded op reads (staged inputs, q/out/new K/V, workspace, ALiBi,
// the bad-block flag) is fixed for the executor's lifetime, or moves only through rebind_layers,
// which records every graph again.
#pragma once

#include <cstddef>
#include <cstdint>

#include "decodegraph/executor.hpp"
#include "executor/backend.hpp"
#include "executor/layers.hpp"
#include "executor/plan_book.hpp"
#include "executor/staging.hpp"
#include "kernels/band_select.cuh"

namespace decodegraph::detail {

/// The executor memory every graph binds besides the layers' buffers.
struct GraphTargets {
  StagedInputs inputs;
  const float* alibi = nullptr;  // [num_q_heads] or null
  void* workspace = nullptr;     // V2 partials, shared by every layer and plan
  std::size_t workspace_bytes = 0;
  int* bad_block = nullptr;      // device flag (BadBlockReport)
  int* bad_block_h = nullptr;    // its pinned copy, written last by every graph
  bool programmatic = false;     // PDL in effect (ExecutorConfig::programmatic_launch, device sm_90+)
};

class Recorder {
 public:
  Recorder(const ExecutorConfig& config, Backend& backend, const LayerSet& layers, const PlanBook& plans,
           const GraphTargets& targets, StepBody body);

  /// Records the graph of a step launch (BandSelect::kHost; `group_plans` one per layer group, a
  /// PlanBook::Launch's): the body with every attention call launching its layer's group's plan,
  /// then the copy of the bad-block flag. StepContext::plan() is group 0's.
  void record(const std::vector<BucketPlan>& group_plans);
  /// Records the graph of batch bucket `bucket` (BandSelect::kDevice): the band-select node first
  /// (after staging, before any attention), then the body with every attention call a SWITCH node
  /// over the bucket's bands, then the flag copy. `graph_plan` is what StepContext::plan() says.
  void record_switch(int bucket, const BucketPlan& graph_plan, const kernels::BandSelectParams& select);
  /// One layer's attention as `p` launches it (the plan of the layer's group in a graph, or a
  /// kMeasured candidate of it), with the layer's own spec.
  void attention(const BucketPlan& p, int layer, const void* q, void* out, int64_t q_stride, int64_t out_stride);

 private:
  friend class decodegraph::StepContext;
  void record_body(const BucketPlan& plan, const std::vector<BucketPlan>* group_plans, int switch_bucket);
  void append(const BucketPlan& plan, int layer);
  void attention_switch(int bucket, int layer, const void* q, void* out, int64_t q_stride, int64_t out_stride);

  const ExecutorConfig& cfg_;
  Backend& backend_;
  const LayerSet& layers_;
  const PlanBook& plans_;
  const GraphTargets& targets_;
  StepBody body_;
  int switch_nodes_ = 0;  // SWITCH nodes in the capture being recorded
};

}  // namespace decodegraph::detail
