// Executor::Impl (internal): the parts an Executor is wired from, in the one direction their
// dependencies run (docs/architecture.md):
//   executor.cpp, stats.cpp -> graph cache -> measurer, recorder -> staging, layers, plan book,
//   bad-block report -> memory -> backend.
// Shared by executor.cpp (construction, step, rebind) and stats.cpp (statistics, memory report).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "decodegraph/executor.hpp"
#include "executor/backend.hpp"
#include "executor/bad_block.hpp"
#include "executor/device_guard.hpp"
#include "executor/graph_cache.hpp"
#include "executor/layers.hpp"
#include "executor/measure.hpp"
#include "executor/memory.hpp"
#include "executor/plan_book.hpp"
#include "executor/recorder.hpp"
#include "executor/staging.hpp"

namespace spdlog {
class logger;
}

namespace decodegraph {

struct Executor::Impl {
  // Declared first so it is destroyed last: every buffer and graph below is freed through it.
  std::unique_ptr<detail::Backend> backend;
  // Binds the executor's device while the members below are destroyed (device_guard.hpp).
  detail::DeviceTeardown teardown;
  ~Impl() {
    if (backend) teardown.bind(*backend);
  }
  std::unique_ptr<detail::Allocations> memory;
  std::shared_ptr<spdlog::logger> log;
  ExecutorConfig cfg;                        // resolved
  BandSelect band_mode = BandSelect::kHost;  // in effect, after any fallback
  std::string band_note;                     // why kDevice fell back
  bool programmatic = false;                 // ExecutorConfig::programmatic_launch in effect
  std::string programmatic_note;             // why it is not
  detail::MemoryLedger ledger;
  std::unique_ptr<detail::PlanBook> plans;
  std::unique_ptr<detail::LayerSet> layers;
  std::unique_ptr<detail::StepStaging> staging;
  std::unique_ptr<detail::BadBlockReport> bad_blocks;
  detail::GraphTargets targets;
  std::unique_ptr<detail::Recorder> recorder;
  std::unique_ptr<detail::Measurer> measurer;
  std::unique_ptr<detail::GraphCache> graphs;
  long long steps = 0, rejected = 0;
  int rebinds = 0, graph_updates = 0, graph_reinstantiations = 0;

  /// The backend config.backend names (kAuto: CUDA where a device is present).
  void make_backend(BackendKind requested);
  /// Checks the memory budget against every buffer's size, then allocates them and wires the parts.
  void build(StepBody body);
  StepResult step(const StepInputs& inputs, std::optional<Stream> stream);
};

}  // namespace decodegraph
