// KernelPolicy::kMeasured (internal): times a bucket's candidate launches (V1, V2 at partition
// sizes around kAuto's) and keeps the fastest. Both graph caches measure through here: kHost on the
// step's own staged inputs, kDevice (whose graph holds every band) on synthetic inputs per band.
#pragma once

#include <cstddef>
#include <memory>

#include "decodegraph/executor.hpp"
#include "executor/backend.hpp"
#include "executor/layers.hpp"
#include "executor/memory.hpp"
#include "executor/plan_book.hpp"
#include "executor/recorder.hpp"
#include "executor/staging.hpp"

namespace spdlog {
class logger;
}

namespace decodegraph::detail {

class Measurer {
 public:
  /// Device bytes the constructor allocates: the candidates' output buffer under kMeasured, else 0.
  static std::size_t device_bytes(const ExecutorConfig& config);
  Measurer(const ExecutorConfig& config, Backend& backend, Allocations& memory, Recorder& recorder,
           StepStaging& staging, PlanBook& plans, const LayerSet& layers, std::shared_ptr<spdlog::logger> log);

  /// Measures bucket plan `idx` on the inputs staged now and joins it to the fastest candidate's launch.
  void measure(std::size_t idx);
  /// The same on synthetic inputs in the plan's band (StepStaging::stage_synthetic); the caller
  /// stages its own inputs again afterwards.
  void measure_synthetic(std::size_t idx);
  /// Every band of `bucket` not measured yet, on synthetic inputs.
  void measure_bucket(int bucket);

  int measured_buckets() const { return measured_buckets_; }
  int candidate_graphs() const { return candidate_graphs_; }
  double measure_ms() const { return measure_ms_; }

 private:
  const ExecutorConfig& cfg_;
  Backend& backend_;
  Recorder& recorder_;
  StepStaging& staging_;
  PlanBook& plans_;
  const LayerSet& layers_;
  std::shared_ptr<spdlog::logger> log_;
  void* out_ = nullptr;  // [max_batch, num_q_heads, head_size]: candidates write here
  int measured_buckets_ = 0;
  int candidate_graphs_ = 0;
  double measure_ms_ = 0;
};

}  // namespace decodegraph::detail
