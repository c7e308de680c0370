// The executor's backend interface (internal): memory, staging copies, capture/instantiate/update/
// launch of a graph, the stream a step runs on, and the ops a step enqueues. Two implementations:
// the CUDA backend (executor/cuda/) captures a stream into a cudaGraph_t; the host backend
// (host_backend.cpp; host_recording.hpp, host_ops.hpp) records closures with their arguments bound
// and reruns them on replay, so it has graph semantics.
//
// Every operation consults decodegraph::fault::should_fail(site) first and throws Error naming the
// call (or its host twin) when a failure is injected, leaving nothing half-built.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "decodegraph/attention.hpp"
#include "decodegraph/executor.hpp"
#include "kernels/band_select.cuh"

namespace decodegraph::detail {

/// An instantiated, launchable graph.
class BackendGraph {
 public:
  virtual ~BackendGraph() = default;
  virtual int nodes() const = 0;
  /// Device memory the graph holds (estimate on CUDA, 0 on host).
  virtual std::size_t bytes() const = 0;
};

/// A captured graph not yet instantiated (or to be applied to an instantiated one).
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
};

/// What the backend knows about the memory behind a pointer.
///   kUnknown             nothing (the host backend; memory the driver cannot place)
///   kDevice              device memory that ends bytes_from_ptr after the pointer: a cudaMalloc
///                        allocation's end, or the first unmapped byte of a VMM range or pool
///   kDeviceSizeUnknown   device memory whose end the backend cannot bound (a VMM range or a memory
///                        pool mapped on past what it walks): at least bytes_from_ptr, not checked
///   kHostOnly            host memory the device cannot read
struct AddressRange {
  enum Kind { kUnknown, kDevice, kHostOnly, kDeviceSizeUnknown };
  Kind kind = kUnknown;
  std::size_t bytes_from_ptr = 0;
};

/// Pinned host mirrors of the staged inputs (staging_ring.hpp): the host may stage a step while the
/// copies of the two before it are still in flight.
inline constexpr int kStagingSlots = 3;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  /// The backend's own stream (nullptr on host).
  virtual Stream stream() const = 0;
  /// The device model for `spec` (called once, at construction, outside any capture): CUDA queries
  /// the SM count and the pass-1 kernel's occupancy; the host backend models an H200.
  virtual DeviceModel device_model(const AttentionSpec& spec) const = 0;

  // ------------------------------------------------------------ the executor's device
  /// Makes the executor's device current for an entry point and returns the device that was current
  /// before, for leave_device (device_guard.hpp's DeviceScope pairs them). CUDA: the device current
  /// at construction; cudaGetDevice, and cudaSetDevice only where they differ. Host: counts the
  /// entry, and every operation below counts whether it ran inside one (device_guard.hpp).
  virtual int enter_device() = 0;
  /// Makes `previous` current again. Never throws (a failure is logged and cleared).
  virtual void leave_device(int previous) noexcept = 0;

  // ------------------------------------------------------------ the step's stream
  /// Makes `s` (nullopt: the backend's own stream) the stream that staging, downloads, launches and
  /// timing use until end_step(), and orders it after the previous step's work when the stream
  /// changed. Every begin_step is followed by end_step, also when the step fails.
  /// When `s` is being captured by the caller (an engine capturing its forward pass), the step is
  /// recorded into that capture instead (in_caller_capture()): nothing is ordered, nothing waits.
  /// Throws InvalidArgument for a stream whose capture was invalidated, or the legacy stream while
  /// another stream of the thread is being captured.
  virtual void begin_step(std::optional<Stream> s) = 0;
  /// Marks the end of the step's work on its stream (what the next step, wait_last_step and the
  /// destructor order after; nothing after a step recorded into a caller's capture). Never throws.
  virtual void end_step() noexcept = 0;
  /// Between begin_step and end_step: the step's stream is being captured by the caller, so what the
  /// step enqueues (staging, and the work begin_caller_capture records) goes into the caller's graph.
  virtual bool in_caller_capture() const = 0;
  /// Blocks until the last step's work has finished (CUDA: an event, which stays valid even if the
  /// caller's stream is destroyed meanwhile).
  virtual void wait_last_step() = 0;

  // ------------------------------------------------------------ memory (site kAlloc / kMemcpy)
  /// Zero-initialised executor memory (device on CUDA, host on the host backend), 256-byte aligned.
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void free(void* p) noexcept = 0;
  /// Pinned host memory for staging (plain host memory on the host backend).
  virtual void* alloc_host(std::size_t bytes) = 0;
  virtual void free_host(void* p) noexcept = 0;
  /// Synchronous copy host -> executor memory, on the backend's own stream (outside steps).
  virtual void upload(void* dst, const void* src, std::size_t bytes) = 0;
  /// Synchronous copy of caller memory in `space` to host, on the step's stream (validation of
  /// device inputs): waits for everything queued there before.
  virtual void download(void* dst, const void* src, std::size_t bytes, MemorySpace space) = 0;
  /// Staging: 2D copy of `rows` rows of `width` bytes, ordered on the step's stream. src is in
  /// `space` (host staging mirror or caller device memory), dst is executor memory.
  virtual void stage_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                        std::size_t width, std::size_t rows, MemorySpace space) = 0;
  /// Staging: byte fill of executor memory, ordered on the step's stream.
  virtual void stage_fill(void* dst, int byte, std::size_t bytes) = 0;
  /// Blocks until the last staging copies that read pinned mirror slot `slot` (0..kStagingSlots-1,
  /// staging_ring.hpp) have read it (CUDA: that slot's event).
  virtual void wait_staging_reusable(int slot) = 0;
  /// Marks the end of the staging copies reading slot `slot` (CUDA: records its event on the step's stream).
  virtual void staging_done(int slot) = 0;
  /// Whether the copies that last read slot `slot` are done, without waiting (CUDA: cudaEventQuery).
  /// Host: true (its copies are synchronous) unless a test holds them (host_staging_copies_pending).
  virtual bool staging_reusable_now(int slot) = 0;
  /// What the backend can tell about the allocation behind `p` (CUDA: the driver's address range).
  virtual AddressRange address_range(const void* p) const = 0;

  // ------------------------------------------------------------ graphs
  virtual void begin_capture() = 0;  // kCaptureBegin, on the backend's own stream
  /// Ends the capture (kCaptureEnd). On failure the capture is over and nothing survives.
  virtual std::unique_ptr<CapturedGraph> end_capture() = 0;
  /// Instantiates a captured graph (kInstantiate).
  virtual std::unique_ptr<BackendGraph> instantiate(CapturedGraph& captured) = 0;
  /// Applies a re-captured graph to `exec` in place (kGraphUpdate), re-instantiating where the
  /// update is refused (kInstantiate). Returns true when updated in place. On failure `exec` is
  /// unchanged (still the old graph).
  virtual bool update(BackendGraph& exec, CapturedGraph& captured) = 0;
  /// end_capture, then instantiate.
  std::unique_ptr<BackendGraph> end_capture_and_instantiate() {
    std::unique_ptr<CapturedGraph> g = end_capture();
    return instantiate(*g);
  }
  /// end_capture, then update. Returns true when updated in place.
  bool end_capture_and_update(BackendGraph& exec) {
    std::unique_ptr<CapturedGraph> g = end_capture();
    return update(exec, *g);
  }
  /// Ends a capture that is being abandoned (an exception escaped); never throws.
  virtual void abort_capture() noexcept = 0;
  /// Records the ops that follow (and band_select / SWITCH nodes, as in a capture of ours) into the
  /// caller's capture of the step's stream (in_caller_capture() must hold). end_caller_capture
  /// finishes our part (CUDA: writes the SWITCH handles into the band-select node) and leaves the
  /// caller's capture open; abort_capture() abandons our part, what was recorded stays in theirs.
  virtual void begin_caller_capture() = 0;
  virtual void end_caller_capture() = 0;
  /// The stream a capture in progress records on, for a step body's own work: the own stream, or
  /// the caller's while recording into its capture (nullptr on host).
  virtual Stream capture_stream() const = 0;
  virtual void launch(BackendGraph& g) = 0;  // kGraphLaunch, on the step's stream
  /// Launches `g` once to warm up, then `replays` times, and returns the microseconds per replay
  /// (CUDA: events on the step's stream; host: the wall clock). Refused during a capture.
  virtual double time_replays(BackendGraph& g, int replays) = 0;

  // ------------------------------------------------------------ ops (recorded while capturing)
  virtual void attention_v1(const DecodeArgs& args) = 0;
  virtual void attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                            std::size_t workspace_bytes) = 0;
  virtual void append(const AppendArgs& args) = 0;
  /// Copies `bytes` of executor memory to pinned host memory (kMemcpy when recorded).
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  /// Host backend: records fn. CUDA backend: throws Error.
  virtual void host_work(std::function<void()> fn) = 0;

  // ------------------------------------------------------------ band choice in the graph (kDevice)
  /// Whether a graph can choose a branch when it runs. CUDA: driver and runtime >= 12.8 and a probe
  /// graph with a SWITCH node that instantiates (once per process, outside any capture). Host:
  /// always. On false, `why` says what is missing. Never throws.
  virtual bool switch_supported(std::string& why) = 0;
  /// Whether launches can use programmatic dependent launch (CUDA: compute capability 9.0 or newer;
  /// host: no, there is nothing to overlap). On false, `why` says why. Never throws. When the
  /// executor turns it on, the ops' programmatic_launch flags are set and the backend keeps them
  /// only where the launch's upstream nodes are all kernel nodes.
  virtual bool programmatic_launch_supported(std::string& why) const = 0;
  /// Records the band-select node (capture only): it computes the band of the staged lengths when
  /// the graph runs, counts it in p.branch_counts, and sets the value of every SWITCH node recorded
  /// after it in this capture (p.handles is filled by the backend).
  virtual void band_select(const kernels::BandSelectParams& p) = 0;
  /// Records a SWITCH node of `branches` branches whose value the capture's band-select node sets.
  /// Then, for each branch in order, begin_branch / ops / end_branch, and end_switch. Throws Error
  /// without a band-select node before it, or past kernels::kMaxSwitchHandles SWITCH nodes.
  virtual void begin_switch(int branches) = 0;
  /// Starts branch `branch` of the open SWITCH node. `key` names its launches: when an earlier
  /// branch of this node had the same key, the branch reuses that recording and this returns false
  /// (record nothing; still call end_branch).
  virtual bool begin_branch(int branch, int key) = 0;
  virtual void end_branch() = 0;
  virtual void end_switch() = 0;
  /// Copies `bytes` of executor memory to the host after waiting for the last step, for statistics
  /// (the branch counters). Not a fault site; returns false instead of throwing on a CUDA error.
  virtual bool read_for_stats(void* dst, const void* src, std::size_t bytes) noexcept = 0;
};

std::unique_ptr<Backend> make_host_backend();
#if DECODEGRAPH_HAS_CUDA
std::unique_ptr<Backend> make_cuda_backend();
#endif

}  // namespace decodegraph::detail
