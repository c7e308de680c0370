// kMeasured (measure.hpp).
#include "executor/measure.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "executor/config_checks.hpp"
#include "executor/gqa_plan.hpp"
#include "executor/layer_groups.hpp"
#include "executor/nvtx.hpp"
#include "executor/scoped.hpp"

namespace decodegraph::detail {

std::size_t Measurer::device_bytes(const ExecutorConfig& c) {
  if (c.policy != KernelPolicy::kMeasured) return 0;
  std::size_t row = 0;  // the widest layer's output row
  for (int l = 0; l < c.num_layers; ++l) {
    const AttentionSpec& s = layer_spec(c, l);
    row = std::max(row, static_cast<std::size_t>(s.num_q_heads) * s.head_size * dtype_size(s.dtype));
  }
  return max_rows(c) * row;  // [max_batch, max q_len] rows
}

Measurer::Measurer(const ExecutorConfig& config, Backend& backend, Allocations& memory, Recorder& recorder,
                   StepStaging& staging, PlanBook& plans, const LayerSet& layers,
                   std::shared_ptr<spdlog::logger> log)
    : cfg_(config),
      backend_(backend),
      recorder_(recorder),
      staging_(staging),
      plans_(plans),
      layers_(layers),
      log_(std::move(log)) {
  if (const std::size_t bytes = device_bytes(config)) out_ = memory.device(bytes);
}

// Each layer group is measured on its own: for each of its candidates, a graph of that group's
// layers' attention (no KV append, no step body: nothing but executor memory is written, the output
// going to out_), replayed on the staged inputs (one warm-up, then measure_replays timed replays).
// Layers run one after another, so the step's fastest launches are each group's fastest, found with
// as many candidates per group as one group has, not their product. The results are applied only
// once every group is measured, and the cell joins its launch. Runs outside any capture, before the
// cell's real graph is captured; bounded by groups x 4 candidates x (1 + measure_replays) replays.
// On any exception the cell stays unmeasured (the candidate graphs are discarded, no plan changed)
// and the next step measures it again.
void Measurer::measure(std::size_t cell) {
  NvtxRange range("decodegraph::measure");
  const auto t0 = std::chrono::steady_clock::now();
  struct Result {
    std::vector<PlanCandidate> cands;
    std::size_t best = 0;
  };
  std::vector<Result> results;
  for (int g = 0; g < plans_.num_groups(); ++g) {
    const BucketPlan& plan = plans_.group_plan(g, cell);
    const ExecutorConfig& gc = plans_.group_config(g);
    Result r{plan.candidates, 0};
    for (std::size_t k = 0; k < r.cands.size(); ++k) {
      BucketPlan trial = plan;
      set_launch(trial, gc, r.cands[k].kernel, r.cands[k].partition_size);
      backend_.begin_capture();
      AbortCapture abort{&backend_};
      for (int l : plans_.groups()[g].layers) recorder_.attention(trial, l, layers_[l].q, out_, layers_[l].q_stride, 0);
      abort.armed = false;
      std::unique_ptr<BackendGraph> graph = backend_.end_capture_and_instantiate();
      ++candidate_graphs_;
      const double us = backend_.time_replays(*graph, cfg_.measure_replays);
      r.cands[k].us = cfg_.measure_clock ? cfg_.measure_clock(plan, r.cands[k]) : us;
      if (r.cands[k].us < r.cands[r.best].us) r.best = k;  // ties keep the earlier: V1, then kAuto's P
    }
    results.push_back(std::move(r));
  }
  std::string why;
  for (int g = 0; g < plans_.num_groups(); ++g) {
    BucketPlan& plan = plans_.group_plan(g, cell);
    Result& r = results[static_cast<std::size_t>(g)];
    set_launch(plan, plans_.group_config(g), r.cands[r.best].kernel, r.cands[r.best].partition_size);
    plan.candidates = std::move(r.cands);
    plan.reason = PlanReason::kMeasuredFastest;
    why += (plans_.num_groups() > 1 ? (g ? "; group " : "group ") + std::to_string(g) + ": " : "") +
           describe_reason(plan);
  }
  plans_.join(cell);
  const BucketPlan& plan = plans_.plan(cell);
  const double ms = ms_since(t0);
  plans_.launch(plan.graph_id).measure_ms += ms;
  measure_ms_ += ms;
  ++measured_buckets_;
  log_->info("measured bucket batch {} band {} ({},{}] in {:.3f} ms: {}", plan.batch, plan.band, plan.band_lo,
             plan.band_hi, ms, why);
}

void Measurer::measure_synthetic(std::size_t idx) {
  staging_.stage_synthetic(plans_.plan(idx));
  measure(idx);
}

void Measurer::measure_bucket(int bucket) {
  for (int band = 0; band < plans_.num_bands(); ++band) {
    const std::size_t idx = plans_.index(bucket, band);
    if (plans_.plan(idx).graph_id < 0) measure_synthetic(idx);
  }
}

}  // namespace decodegraph::detail
