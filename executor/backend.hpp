// The executor's backend interface (internal): memory, staging copies, capture/instantiate/update/
// launch of a graph, and the ops a step enqueues. Two implementations: the CUDA backend
// (executor/cuda/) captures a stream into a cudaGraph_t; the host backend (host_backend.cpp) records
// closures with their arguments bound and reruns them on replay, so it has graph semantics.
//
// Every operation consults decodegraph::fault::should_fail(site) first and throws Error naming the
// call (or its host twin) when a failure is injected, leaving nothing half-built.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "decodegraph/attention.hpp"
#include "decodegraph/executor.hpp"

namespace decodegraph::detail {

/// An instantiated, launchable graph.
class BackendGraph {
 public:
  virtual ~BackendGraph() = default;
  virtual int nodes() const = 0;
  /// Device memory the graph holds (estimate on CUDA, 0 on host).
  virtual std::size_t bytes() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual Stream stream() const = 0;
  /// The device model for `spec` (called once, at construction, outside any capture): CUDA queries
  /// the SM count and the pass-1 kernel's occupancy; the host backend models an H200.
  virtual DeviceModel device_model(const AttentionSpec& spec) const = 0;

  // ------------------------------------------------------------ memory (site kAlloc / kMemcpy)
  /// Zero-initialised executor memory (device on CUDA, host on the host backend), 256-byte aligned.
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void free(void* p) noexcept = 0;
  /// Pinned host memory for staging (plain host memory on the host backend).
  virtual void* alloc_host(std::size_t bytes) = 0;
  virtual void free_host(void* p) noexcept = 0;
  /// Synchronous copy host -> executor memory (construction time only).
  virtual void upload(void* dst, const void* src, std::size_t bytes) = 0;
  /// Synchronous copy of caller memory in `space` to host (validation of device inputs).
  virtual void download(void* dst, const void* src, std::size_t bytes, MemorySpace space) = 0;
  /// Staging: 2D copy of `rows` rows of `width` bytes, stream-ordered. src is in `space`
  /// (host staging mirror or caller device memory), dst is executor memory.
  virtual void stage_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                        std::size_t width, std::size_t rows, MemorySpace space) = 0;
  /// Staging: byte fill of executor memory, stream-ordered.
  virtual void stage_fill(void* dst, int byte, std::size_t bytes) = 0;
  /// Blocks until the previous step's staging copies have read the host mirror (CUDA: event wait).
  virtual void wait_staging_reusable() = 0;
  /// Marks the end of this step's staging copies (CUDA: records the event).
  virtual void staging_done() = 0;

  // ------------------------------------------------------------ graphs
  virtual void begin_capture() = 0;  // kCaptureBegin
  /// Ends the capture and instantiates (kCaptureEnd, kInstantiate). On failure nothing survives.
  virtual std::unique_ptr<BackendGraph> end_capture_and_instantiate() = 0;
  /// Ends a capture that is being abandoned (an exception escaped); never throws.
  virtual void abort_capture() noexcept = 0;
  /// Re-captured topology into an existing executable graph: in-place update, falling back to a
  /// fresh instantiation (kGraphUpdate). Consumes the pending capture.
  virtual void end_capture_and_update(BackendGraph& exec) = 0;
  virtual void launch(BackendGraph& g) = 0;  // kGraphLaunch
  /// Launches `g` once to warm up, then `replays` times, and returns the microseconds per replay
  /// (CUDA: events on the executor stream; host: the wall clock). Refused during a capture.
  virtual double time_replays(BackendGraph& g, int replays) = 0;

  // ------------------------------------------------------------ ops (recorded while capturing)
  virtual void attention_v1(const DecodeArgs& args) = 0;
  virtual void attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                            std::size_t workspace_bytes) = 0;
  virtual void append(const AppendArgs& args) = 0;
  /// Host backend: records fn. CUDA backend: throws Error.
  virtual void host_work(std::function<void()> fn) = 0;
};

std::unique_ptr<Backend> make_host_backend();
#if DECODEGRAPH_HAS_CUDA
std::unique_ptr<Backend> make_cuda_backend();
#endif

}  // namespace decodegraph::detail
