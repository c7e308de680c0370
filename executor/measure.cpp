// kMeasured (measure.hpp).
#include "executor/measure.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>
#include <vector>

#include "executor/nvtx.hpp"
#include "executor/plan.hpp"
#include "executor/scoped.hpp"

namespace decodegraph::detail {

std::size_t Measurer::device_bytes(const ExecutorConfig& c) {
  if (c.policy != KernelPolicy::kMeasured) return 0;
  return static_cast<std::size_t>(c.max_batch) * c.spec.num_q_heads * c.spec.head_size * dtype_size(c.spec.dtype);
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

// Captures a graph of every layer's attention for each candidate (no KV append, no step body:
// nothing but executor memory is written, the output going to out_), replays it on the staged
// inputs (one warm-up, then measure_replays timed replays), keeps the fastest and joins the bucket
// to its launch. Runs outside any capture, before the bucket's real graph is captured; bounded by
// 4 candidates x (1 + measure_replays) replays. On any exception the bucket stays unmeasured (the
// candidate graphs are discarded) and the next step measures it again.
void Measurer::measure(std::size_t idx) {
  NvtxRange range("decodegraph::measure");
  const auto t0 = std::chrono::steady_clock::now();
  BucketPlan& plan = plans_.plan(idx);
  std::vector<PlanCandidate> cands = plan.candidates;
  std::size_t best = 0;
  for (std::size_t k = 0; k < cands.size(); ++k) {
    BucketPlan trial = plan;
    set_launch(trial, cfg_, cands[k].kernel, cands[k].partition_size);
    backend_.begin_capture();
    AbortCapture abort{&backend_};
    for (int l = 0; l < cfg_.num_layers; ++l) recorder_.attention(trial, l, layers_[l].q, out_, layers_[l].q_stride, 0);
    abort.armed = false;
    std::unique_ptr<BackendGraph> g = backend_.end_capture_and_instantiate();
    ++candidate_graphs_;
    const double us = backend_.time_replays(*g, cfg_.measure_replays);
    cands[k].us = cfg_.measure_clock ? cfg_.measure_clock(plan, cands[k]) : us;
    if (cands[k].us < cands[best].us) best = k;  // ties keep the earlier: V1, then kAuto's P
  }
  set_launch(plan, cfg_, cands[best].kernel, cands[best].partition_size);
  plan.candidates = std::move(cands);
  plan.reason = PlanReason::kMeasuredFastest;
  plans_.join(idx);
  const double ms = ms_since(t0);
  plans_.launch(plan.graph_id).measure_ms += ms;
  measure_ms_ += ms;
  ++measured_buckets_;
  log_->info("measured bucket batch {} band {} ({},{}] in {:.3f} ms: {}", plan.batch, plan.band, plan.band_lo,
             plan.band_hi, ms, describe_reason(plan));
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
