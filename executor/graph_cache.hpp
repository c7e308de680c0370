// The graph cache (internal): "the graph for this step, captured if missing", rebind_layers'
// re-capture and update, and the graph statistics, behind one interface with two strategies:
//   plan graphs   (BandSelect::kHost)   one graph per distinct launch plan; the step's band, found
//                                        on the host, picks it (plan_graphs.cpp);
//   switch graphs (BandSelect::kDevice) one graph per batch bucket whose SWITCH nodes run the band
//                                        the staged lengths select when it replays (switch_graphs.cpp).
// step() and rebind_layers call the interface and never branch on the strategy. Both measure
// through the Measurer (kMeasured) and record through the Recorder. Under a caller's stream capture
// (an engine capturing its forward pass) the cache records the step's graph work into that capture
// instead of handing out a graph of its own (caller_capture.cpp).
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/backend.hpp"
#include "executor/measure.hpp"
#include "executor/memory.hpp"
#include "executor/plan_book.hpp"
#include "executor/recorder.hpp"
#include "executor/staging.hpp"

namespace spdlog {
class logger;
}

namespace decodegraph::detail {

/// One graph the cache holds (or will hold).
struct GraphSlot {
  BucketPlan plan;  // what StepContext::plan() says while it is recorded
  std::unique_ptr<BackendGraph> graph;  // null until captured
  GraphStats stats;                     // the counters (captures, updates, replays, nodes, times, bytes)
  std::size_t rejected_bytes = 0;       // bytes of a graph the memory budget rejected, 0 if none
};

/// The graph a step replays and what the step's result says about it.
struct StepGraph {
  GraphSlot* slot = nullptr;
  StepResult result;
};

/// What both strategies share: the parts they use (all outlive the cache).
struct CacheParts {
  const ExecutorConfig& cfg;
  Backend& backend;
  Allocations& memory;
  PlanBook& plans;
  Recorder& recorder;
  Measurer& measurer;
  const GraphTargets& targets;
  const MemoryLedger& ledger;
  std::shared_ptr<spdlog::logger> log;
};

class GraphCache {
 public:
  explicit GraphCache(const CacheParts& parts) : p_(parts) {}
  virtual ~GraphCache() = default;
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  /// The graph a step of batch bucket `bucket` replays, with the step's inputs staged already:
  /// measured (kMeasured) and captured first where needed. `restage` stages the step's inputs
  /// again, for a strategy that measures on synthetic inputs. Throws, leaving the cache as it was
  /// apart from measurements and captures that completed.
  virtual StepGraph graph_for(int bucket, const Lengths& lens, const std::function<void()>& restage) = 0;
  /// Measures and captures every graph now (CapturePolicy::kUpFront).
  virtual void capture_all() = 0;

  /// Under a caller's stream capture (Backend::in_caller_capture), before the step reads or enqueues
  /// anything: throws InvalidArgument, saying what to do instead, where the step cannot be recorded
  /// into the capture: host inputs, kFull, kHost without a max_seq_len hint, a kMeasured bucket not
  /// measured yet. Nothing is recorded then, and the caller's capture stays valid.
  void check_caller_capture(const StepInputs& in) const;
  /// Records the work of the graph a step of `bucket` would replay into the caller's capture, after
  /// the staging copies already recorded there; no graph of ours is captured, instantiated or
  /// launched. On an exception what was recorded stays in the caller's capture.
  StepResult record_into_caller(int bucket, const Lengths& lens);
  /// Steps recorded into a caller's capture.
  long long caller_captures() const { return caller_captures_; }
  /// Fills stats.graphs (captured graphs), capture_ms, instantiate_ms and distinct_graphs.
  virtual void add_stats(ExecutorStats& stats) const = 0;
  /// Graphs the strategy needs, each captured at most once (ExecutorStats::distinct_graphs).
  virtual int distinct_graphs() const = 0;
  /// Graph memory held (driver estimate; 0 on host).
  std::size_t bytes() const;

  /// rebind_layers, phase 1: every captured graph recorded again with the layers now in effect.
  /// Throws with nothing changed (the pending recordings are discarded).
  struct Rebound {
    GraphSlot* slot;
    std::unique_ptr<CapturedGraph> captured;
  };
  std::vector<Rebound> recapture();
  /// Phase 2: applies them in place (re-instantiating where an update is refused). A graph whose
  /// update and re-instantiation both fail is dropped, to be captured again when a step needs it;
  /// `first_error` is the first such failure.
  struct RebindResult {
    int updated = 0;
    int reinstantiated = 0;
    int dropped = 0;
    std::exception_ptr first_error;
  };
  RebindResult apply(std::vector<Rebound>& pending);

  int total_captures() const { return total_captures_; }

 protected:
  /// Captures and instantiates `slot`'s graph; `what` names it in a budget error. On any exception
  /// the capture is ended and discarded (no partial graph) and the slot stays uncaptured.
  void capture(GraphSlot& slot, const std::string& what);
  /// Records `slot`'s work into the capture in progress.
  virtual void record(GraphSlot& slot) = 0;
  /// How the capture log line names the graph's kernel ("v1", "every band", ...).
  virtual std::string kernel_text(const GraphSlot& slot) const = 0;
  /// For a decided step of `bucket` (no measuring, no capture): fills `target` with what record()
  /// needs (plan, stats.graph_id) and `r` with what the step's result says about its graph.
  virtual void describe_step(int bucket, const Lengths& lens, GraphSlot& target, StepResult& r) const = 0;
  /// Whether a step of `bucket` with this band length (the hint; 0 under kDevice) has its plans
  /// decided, i.e. needs no kMeasured timing.
  virtual bool decided(int bucket, int band_len) const = 0;
  /// Whether the graph chooses the band itself (kDevice), so the caller's capture needs no hint.
  virtual bool band_on_device() const = 0;

  CacheParts p_;
  /// Every graph the strategy holds or will hold (plan graphs: one per launch id; switch graphs:
  /// one per batch bucket). Only the strategy adds slots, never while a pointer to one is held.
  std::vector<GraphSlot> slots_;

 private:
  void check_budget(const std::string& what, std::size_t bytes) const;
  int total_captures_ = 0;
  long long caller_captures_ = 0;
};

std::unique_ptr<GraphCache> make_plan_graphs(const CacheParts& parts);
/// Allocates the band edges and branch counters (device_bytes of them) from parts.memory.
std::unique_ptr<GraphCache> make_switch_graphs(const CacheParts& parts);
/// Device bytes make_switch_graphs allocates for `config`.
std::size_t switch_graphs_device_bytes(const ExecutorConfig& config);

/// The band choice in effect for `config`: kDevice where the backend (or the switch_probe hook)
/// supports conditional SWITCH nodes, else kHost with `note` saying why and one warning logged.
/// Runs the backend's one-time probe, outside any capture.
BandSelect choose_band_select(const ExecutorConfig& config, Backend& backend, spdlog::logger& log,
                              std::string& note);

}  // namespace decodegraph::detail
