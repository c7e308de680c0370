// CUDA backend: executor memory is cudaMalloc'd, staging mirrors are pinned, graphs are captured
// from a non-blocking stream the backend owns (graphs/) and instantiated once, and each step's
// staging and replay run on the caller's stream or, when none is given, on that same own stream.
//
// Ordering between steps: a step that runs on another stream than the previous one first waits
// (cudaStreamWaitEvent) for `done_`, an event marking the end of the previous step's work, so the
// static buffers every step shares are never rewritten under a running graph. On a caller's stream
// done_ is recorded at the end of each step; on the own stream it is recorded only when needed (a
// stream change, a sync point), which keeps the default path at the API calls it had.
//
// Band choice in the graph (BandSelect::kDevice): band_select() launches the band-select kernel into
// the capture and remembers its node; each begin_switch() creates a conditional handle on the
// captured graph and adds a SWITCH node after the current capture dependencies
// (cudaStreamGetCaptureInfo, cudaGraphAddNode, cudaStreamUpdateCaptureDependencies). A branch is
// recorded by capturing a second stream into the node's body graph (cudaStreamBeginCaptureToGraph);
// a branch whose launches equal an earlier branch's is a child-graph node cloned from that body
// (the driver copies a child graph, so it is captured once but still instantiated per branch).
// When the capture ends, the handles are written into the band-select node's parameters, so one
// kernel sets every SWITCH node of the graph. One handle per node: the API documents a handle as
// belonging to one conditional node, so sharing one is not relied upon.
//
// rebind_layers re-captures a SWITCH graph and re-instantiates it (update() below), never
// cudaGraphExecUpdate: the re-capture creates new conditional handles, and the documentation does not
// say whether an update rebinds a conditional node to a new handle. If it kept the old binding, the
// new band-select node would set handles no node reads, and every band would run a stale branch.
//
// Launch checks: an error that earlier CUDA work on this thread left pending is taken before each
// of our launches and logged as not ours (clear_leftover), so it is neither blamed on a launch nor
// cached as the SWITCH probe's answer (kernels/cuda_check.hpp).
//
// Staging ring: one event per pinned mirror slot (staging_ring.hpp), queried to find a slot whose
// copies are done, and waited on only when none is.
//
// Uploads: every instantiation (and re-instantiation on rebind) is followed by cudaGraphUpload on
// the step's stream, so the graph's first replay does not also pay for moving it to the device.
//
// A caller's capture: when begin_step finds the step's stream being captured by someone else (an
// engine capturing its forward pass), nothing is ordered on it (no event waits or records: an event
// recorded into a capture cannot be waited on outside it) and the step's work is recorded into that
// capture: ops go to the caller's stream instead of ours (top()), the band-select node and the
// SWITCH nodes are added to the caller's capture graph exactly as to ours, and end_caller_capture()
// writes the handles into the band-select node, a change to an existing node that the runtime allows
// while the capture is in progress (cudaStreamGetCaptureInfo: every operation on the graph but
// destroying it and removing nodes). No graph of ours is captured, instantiated or launched then.
//
// The device: captured at construction (the current device). Every entry point binds it through
// enter_device/leave_device (executor/device_guard.hpp); the destructor and the frees, which also run
// from destructors, bind it themselves.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "executor/backend.hpp"
#include "graphs/graph.hpp"
#include "kernels/band_select.cuh"
#include "kernels/cuda_check.hpp"
#include "kernels/occupancy.hpp"

namespace decodegraph::detail {
namespace {

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

class CudaCaptured final : public CapturedGraph {
 public:
  CudaCaptured(graphs::Graph g, int branch, bool conditional)
      : graph(std::move(g)), branch_nodes(branch), has_switch(conditional) {}
  graphs::Graph graph;
  int branch_nodes = 0;  // nodes inside SWITCH bodies (cudaGraphGetNodes counts the top level only)
  bool has_switch = false;  // holds SWITCH nodes: rebinding re-instantiates it (file comment)
};

// Logs an error earlier CUDA work on this thread left pending, found (and cleared) before `before`.
void log_leftover(cudaError_t err, const char* before) {
  if (auto log = spdlog::get("decodegraph"))
    log->warn("a CUDA error that earlier work on this thread left pending, {} ({}), was found before {}; it is "
              "not decodegraph's (check your own launches), and was cleared",
              cudaGetErrorName(err), cudaGetErrorString(err), before);
}

// Nodes of a (body) graph; 0 if the driver cannot say.
int count_nodes(cudaGraph_t g) {
  std::size_t n = 0;
  if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<int>(n);
}

class CudaGraph final : public BackendGraph {
 public:
  CudaGraph(graphs::Graph g, graphs::GraphExec e, int branch_nodes)
      : graph_(std::move(g)), exec_(std::move(e)), nodes_(graph_.nodes() + branch_nodes) {}
  int nodes() const override { return nodes_; }
  std::size_t bytes() const override { return graphs::estimate_graph_bytes(nodes_); }
  void launch(cudaStream_t s) const { exec_.launch(s); }
  const graphs::GraphExec& exec() const { return exec_; }
  /// True when updated in place; `reinstantiate` skips the in-place attempt. On a failed
  /// re-instantiation exec_ keeps the old graph.
  bool update(graphs::Graph g, int branch_nodes, bool reinstantiate) {
    bool in_place = false;
    if (reinstantiate)
      exec_ = graphs::GraphExec::instantiate(g);
    else
      in_place = exec_.update(g);
    nodes_ = g.nodes() + branch_nodes;
    graph_ = std::move(g);
    return in_place;
  }

 private:
  graphs::Graph graph_;
  graphs::GraphExec exec_;
  int nodes_ = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    DG_CUDA_CHECK(cudaGetDevice(&device_));
    DG_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_));
    DG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cur_ = last_ = stream_;
    cudaError_t err = cudaStreamCreateWithFlags(&branch_stream_, cudaStreamNonBlocking);
    for (cudaEvent_t& e : staged_)
      if (err == cudaSuccess) err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreate(&timing_[0]);
    if (err == cudaSuccess) err = cudaEventCreate(&timing_[1]);
    if (err != cudaSuccess) {
      destroy();
      DG_CUDA_CHECK(err);
    }
    load_driver_entry_points();
  }
  ~CudaBackend() override {
    const int previous = bind_noexcept();
    scope_.reset();
    drain();
    destroy();
    leave_device(previous);
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  Stream stream() const override { return stream_; }
  DeviceModel device_model(const AttentionSpec& spec) const override {
    DeviceModel d;
    d.num_sms = sms_;
    d.blocks_per_sm = kernels::pass1_blocks_per_sm_on_device(spec);
    return d;
  }

  // ------------------------------------------------------------ the executor's device
  int enter_device() override {
    int previous = 0;
    DG_CUDA_CHECK(cudaGetDevice(&previous));
    if (previous != device_) DG_CUDA_CHECK(cudaSetDevice(device_));
    return previous;
  }
  void leave_device(int previous) noexcept override {
    if (previous == device_) return;
    const cudaError_t err = cudaSetDevice(previous);
    if (err == cudaSuccess) return;
    (void)cudaGetLastError();
    if (auto log = spdlog::get("decodegraph"))
      log->warn("could not make device {} current again after an executor call on device {}: {}", previous, device_,
                cudaGetErrorName(err));
  }

  void* alloc(std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kAlloc)) injected("cudaMalloc", fault::Site::kAlloc);
    void* p = nullptr;
    DG_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 256 : bytes));
    // Zero on our stream and wait: a cudaMemset on the legacy stream is not ordered with the
    // non-blocking stream_, nor with a caller's later writes (e.g. q through cudaMemcpy).
    cudaError_t err = cudaMemsetAsync(p, 0, bytes == 0 ? 256 : bytes, stream_);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) {
      cudaFree(p);
      DG_CUDA_CHECK(err);
    }
    return p;
  }
  // Work still queued (a replay, a staging copy) may read the buffer: drain it first.
  void free(void* p) noexcept override {
    const int previous = bind_noexcept();
    drain();
    cudaFree(p);
    leave_device(previous);
  }
  void* alloc_host(std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kAlloc)) injected("cudaMallocHost", fault::Site::kAlloc);
    void* p = nullptr;
    DG_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 256 : bytes));
    return p;
  }
  // A staging copy in flight may still read the pinned mirror.
  void free_host(void* p) noexcept override {
    const int previous = bind_noexcept();
    drain();
    cudaFreeHost(p);
    leave_device(previous);
  }

  // ------------------------------------------------------------ the step's stream
  void begin_step(std::optional<Stream> s) override {
    cur_ = s ? *s : stream_;
    caller_ = false;
    // One query per step: is the step's stream being captured by the caller (file comment)?
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t err = cudaStreamIsCapturing(cur_, &status);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      cur_ = stream_;
      if (err == cudaErrorStreamCaptureImplicit)
        throw_invalid("stream", "the legacy default stream",
                      "a non-blocking stream, or the stream being captured (another stream of this thread is being "
                      "captured, and the legacy stream would join that capture)");
      DG_CUDA_CHECK(err);
    }
    if (status == cudaStreamCaptureStatusInvalidated) {
      cur_ = stream_;
      throw_invalid("stream", "a stream whose capture was invalidated",
                    "a stream that is not being captured, or one whose capture is active (end the invalidated "
                    "capture with cudaStreamEndCapture first)");
    }
    if (status == cudaStreamCaptureStatusActive && !scope_) {
      caller_ = true;  // nothing to order: the work is recorded, not run, and the caller replays it
      return;
    }
    if (cur_ == last_) return;
    // NOTE(graph): consecutive steps share the staged buffers, the workspace and the flag; a step on
    // another stream must not start before the previous one is done with them.
    if (last_ == stream_) DG_CUDA_CHECK(cudaEventRecord(done_, stream_));  // recorded lazily on the own stream
    DG_CUDA_CHECK(cudaStreamWaitEvent(cur_, done_, 0));
  }
  void end_step() noexcept override {
    if (caller_) {  // nothing ran: done_ still marks the last step that did
      caller_ = recording_caller_ = false;
      cur_ = stream_;
      return;
    }
    if (cur_ != stream_) {
      // If this fails the stream is unusable and nothing of this step was enqueued there: done_
      // still marks the previous step, which stays the one to order after.
      if (cudaEventRecord(done_, cur_) != cudaSuccess) {
        (void)cudaGetLastError();
        cur_ = stream_;
        return;
      }
    }
    last_ = cur_;
    cur_ = stream_;
  }
  bool in_caller_capture() const override { return caller_; }
  void wait_last_step() override {
    if (last_ == stream_) {
      DG_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    DG_CUDA_CHECK(cudaEventSynchronize(done_));
  }

  void upload(void* dst, const void* src, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpyAsync", fault::Site::kMemcpy);
    DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    DG_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(void* dst, const void* src, std::size_t bytes, MemorySpace space) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpyAsync", fault::Site::kMemcpy);
    DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                                  space == MemorySpace::kDevice ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost,
                                  cur_));
    DG_CUDA_CHECK(cudaStreamSynchronize(cur_));
  }
  void stage_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                std::size_t rows, MemorySpace space) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpy2DAsync", fault::Site::kMemcpy);
    if (width == 0 || rows == 0) return;
    const cudaMemcpyKind kind = space == MemorySpace::kDevice ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    if (rows == 1)
      DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, width, kind, cur_));
    else
      DG_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind, cur_));
  }
  void stage_fill(void* dst, int byte, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemsetAsync", fault::Site::kMemcpy);
    if (bytes) DG_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, cur_));
  }
  // A pinned mirror slot is rewritten when its turn comes again; wait until the copies that last read
  // it are done. An event, not a stream: it holds whichever stream that step ran on.
  void wait_staging_reusable(int slot) override { DG_CUDA_CHECK(cudaEventSynchronize(staged_[slot])); }
  void staging_done(int slot) override { DG_CUDA_CHECK(cudaEventRecord(staged_[slot], cur_)); }
  bool staging_reusable_now(int slot) override {
    const cudaError_t err = cudaEventQuery(staged_[slot]);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: never left pending for a later launch check
      return false;
    }
    DG_CUDA_CHECK(err);
    return true;
  }

  // A cudaMalloc allocation is one range and cuMemGetAddressRange gives its exact end. VMM memory
  // (cuMemCreate + cuMemMap: PyTorch's expandable segments) and memory-pool allocations
  // (cudaMallocAsync) may span several mappings, of which the driver reports only the one holding
  // the pointer; so for them the mappings are walked, each adjacent to the last, up to the first
  // unmapped byte (reading past it faults), for at most kMaxMappingsWalked mappings: past that the
  // end is left unknown and nothing is rejected. A caller's k_cache_bytes is checked either way.
  AddressRange address_range(const void* p) const override {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    if (attr.type == cudaMemoryTypeUnregistered) return {AddressRange::kHostOnly, 0};
    if (!drv_.get_range) return {};
    CUdeviceptr base = 0;
    std::size_t size = 0;
    const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(p);
    // Pointers the driver cannot place (host memory of another kind, say): nothing to check.
    if (drv_.get_range(&base, &size, ptr) != CUDA_SUCCESS || ptr < base || ptr - base > size) return {};
    CUdeviceptr end = base + size;
    if (!mapped_in_segments(p)) return {AddressRange::kDevice, static_cast<std::size_t>(end - ptr)};
    for (int i = 0; i < kMaxMappingsWalked; ++i) {
      if (drv_.get_range(&base, &size, end) != CUDA_SUCCESS || base != end || size == 0)
        return {AddressRange::kDevice, static_cast<std::size_t>(end - ptr)};
      end = base + size;
    }
    return {AddressRange::kDeviceSizeUnknown, static_cast<std::size_t>(end - ptr)};
  }

  void begin_capture() override {
    if (scope_) throw Error("cudaStreamBeginCapture failed: a capture is already active on the executor stream");
    if (recording_caller_) throw Error("cudaStreamBeginCapture refused: recording into the caller's capture");
    scope_.emplace(stream_);
  }
  std::unique_ptr<CapturedGraph> end_capture() override {
    const bool open_switch = sw_.active;
    const int branch_nodes = branch_nodes_;
    const BandSelectNode bs = std::move(bs_);
    reset_switch_state();
    graphs::Graph g = take_graph();
    if (open_switch) throw Error("cudaStreamEndCapture: a SWITCH node of the capture is still open");
    set_band_select_handles(bs.node, bs.params);
    return std::make_unique<CudaCaptured>(std::move(g), branch_nodes, bs.params.num_handles > 0);
  }
  std::unique_ptr<BackendGraph> instantiate(CapturedGraph& captured) override {
    auto& c = static_cast<CudaCaptured&>(captured);
    graphs::GraphExec e = graphs::GraphExec::instantiate(c.graph);
    upload_graph(e);
    return std::make_unique<CudaGraph>(std::move(c.graph), std::move(e), c.branch_nodes);
  }
  bool update(BackendGraph& exec, CapturedGraph& captured) override {
    auto& c = static_cast<CudaCaptured&>(captured);
    auto& g = static_cast<CudaGraph&>(exec);
    const bool in_place = g.update(std::move(c.graph), c.branch_nodes, /*reinstantiate=*/c.has_switch);
    if (!in_place) upload_graph(g.exec());  // re-instantiated: a new executable to move to the device
    return in_place;
  }
  void abort_capture() noexcept override {
    if (sw_.active && sw_.branch >= 0 && sw_.fresh) {  // a branch capture is open on branch_stream_
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(branch_stream_, &g);  // g is the SWITCH node's body: not ours to destroy
      (void)cudaGetLastError();
    }
    reset_switch_state();
    if (recording_caller_) {
      recording_caller_ = false;  // the caller's capture stays open: only ours is abandoned
      return;
    }
    scope_.reset();
  }
  void begin_caller_capture() override {
    if (!caller_ || scope_ || recording_caller_)
      throw Error("recording into the caller's capture: the step's stream is not being captured, or a capture is open");
    reset_switch_state();
    recording_caller_ = true;
  }
  void end_caller_capture() override {
    if (!recording_caller_) throw Error("recording into the caller's capture: none open");
    const bool open_switch = sw_.active;
    const BandSelectNode bs = std::move(bs_);
    reset_switch_state();
    recording_caller_ = false;
    if (open_switch) throw Error("recording into the caller's capture: a SWITCH node is still open");
    set_band_select_handles(bs.node, bs.params);
  }
  Stream capture_stream() const override { return top(); }
  void launch(BackendGraph& g) override { static_cast<CudaGraph&>(g).launch(cur_); }
  double time_replays(BackendGraph& g, int replays) override {
    // Never inside a capture: event timing and the synchronisation below are not capturable.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    DG_CUDA_CHECK(cudaStreamIsCapturing(cur_, &status));
    if (scope_ || status != cudaStreamCaptureStatusNone)
      throw Error("kMeasured timing refused: the step's stream is being captured");
    // On the step's stream, after this step's staging: the warm-up also absorbs whatever was queued
    // there before, so the events time the replays alone.
    launch(g);  // warm-up
    DG_CUDA_CHECK(cudaEventRecord(timing_[0], cur_));
    for (int i = 0; i < replays; ++i) launch(g);
    DG_CUDA_CHECK(cudaEventRecord(timing_[1], cur_));
    DG_CUDA_CHECK(cudaEventSynchronize(timing_[1]));
    float ms = 0;
    DG_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_[0], timing_[1]));
    return 1000.0 * ms / (replays > 0 ? replays : 1);
  }

  // The eager launchers are capturable and check kKernelLaunch and cudaGetLastError themselves.
  // They go to the stream being captured: the own stream, or the branch stream inside a SWITCH branch.
  // A step body's own launches may run in between: what they left pending is logged first.
  void attention_v1(const DecodeArgs& args) override {
    clear_leftover("paged_attention_v1");
    paged_attention_v1(args, rec());
  }
  void attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                    std::size_t workspace_bytes) override {
    clear_leftover("paged_attention_v2");
    paged_attention_v2(args, partition_size, workspace, workspace_bytes, rec());
  }
  void append(const AppendArgs& args) override {
    clear_leftover("append_kv");
    append_kv(args, rec());
  }
  // Recorded into the graph: pinned destination, so it is a memcpy node, not a pageable copy.
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpyAsync", fault::Site::kMemcpy);
    DG_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, rec()));
  }

  // ------------------------------------------------------------ SWITCH nodes
  bool switch_supported(std::string& why) override {
    static std::mutex mutex;
    static std::optional<std::pair<bool, std::string>> probed;  // once per process
    std::lock_guard<std::mutex> lock(mutex);
    if (!probed) {
      // Not the probe's own error, so never cached as its answer.
      const cudaError_t pending = cudaGetLastError();
      if (pending != cudaSuccess) {
        log_leftover(pending, "the SWITCH probe");
        if (cuda_error_is_sticky(pending)) {
          why = std::string("the CUDA context was lost before the SWITCH probe (") + cudaGetErrorName(pending) + ")";
          return false;
        }
      }
      probed = probe_switch();
    }
    why = probed->second;
    return probed->first;
  }
  void band_select(const kernels::BandSelectParams& p) override {
    if (!(scope_ || recording_caller_) || sw_.active) throw Error("band select: record it in a capture, outside SWITCH nodes");
    kernels::BandSelectParams params = p;
    params.num_handles = 0;  // filled in at end_capture
    clear_leftover("the band-select launch");
    kernels::launch_band_select(params, top());
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    const cudaGraphNode_t* deps = nullptr;
    std::size_t ndeps = 0;
    DG_CUDA_CHECK(cudaStreamGetCaptureInfo(top(), &status, nullptr, &graph, &deps, nullptr, &ndeps));
    if (status != cudaStreamCaptureStatusActive || ndeps != 1)
      throw Error("band select: the kernel node is not the capture's only dependency (" + std::to_string(ndeps) + ")");
    bs_.node = deps[0];
    bs_.params = params;
    graph_ = graph;
  }
  void begin_switch(int branches) override {
    if (!(scope_ || recording_caller_) || sw_.active) throw Error("SWITCH node: no capture, or one already open");
    if (!bs_.node) throw Error("SWITCH node: no band-select node before it in this capture");
    if (bs_.params.num_handles >= kernels::kMaxSwitchHandles)
      throw Error("SWITCH node: more than " + std::to_string(kernels::kMaxSwitchHandles) + " in one graph");
    cudaGraphConditionalHandle handle = 0;
    DG_CUDA_CHECK(cudaGraphConditionalHandleCreate(&handle, graph_, 0, 0));
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t* deps = nullptr;
    const cudaGraphEdgeData* edges = nullptr;
    std::size_t ndeps = 0;
    DG_CUDA_CHECK(cudaStreamGetCaptureInfo(top(), &status, nullptr, nullptr, &deps, &edges, &ndeps));
    cudaGraphNodeParams params{};
    params.type = cudaGraphNodeTypeConditional;
    params.conditional.handle = handle;
    params.conditional.type = cudaGraphCondTypeSwitch;
    params.conditional.size = static_cast<unsigned>(branches);
    cudaGraphNode_t node = nullptr;
    DG_CUDA_CHECK(cudaGraphAddNode(&node, graph_, deps, edges, ndeps, &params));
    // NOTE(graph): what the capture records next (later layers, the flag copy) runs after the node.
    DG_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(top(), &node, nullptr, 1, cudaStreamSetCaptureDependencies));
    bs_.params.handles[bs_.params.num_handles++] = handle;
    sw_.active = true;
    sw_.bodies.assign(params.conditional.phGraph_out, params.conditional.phGraph_out + branches);
    sw_.by_key.clear();
    sw_.branch = -1;
  }
  bool begin_branch(int branch, int key) override {
    if (!sw_.active || sw_.branch >= 0 || branch < 0 || branch >= static_cast<int>(sw_.bodies.size()))
      throw Error("SWITCH branch: no open SWITCH node, a branch already open, or branch out of range");
    sw_.branch = branch;
    sw_.fresh = false;
    if (auto it = sw_.by_key.find(key); it != sw_.by_key.end()) {
      cudaGraphNode_t child = nullptr;
      DG_CUDA_CHECK(cudaGraphAddChildGraphNode(&child, sw_.bodies[branch], nullptr, 0, sw_.bodies[it->second]));
      branch_nodes_ += 1 + count_nodes(sw_.bodies[it->second]);
      return false;
    }
    sw_.by_key.emplace(key, branch);
    DG_CUDA_CHECK(cudaStreamBeginCaptureToGraph(branch_stream_, sw_.bodies[branch], nullptr, nullptr, 0,
                                                cudaStreamCaptureModeThreadLocal));
    sw_.fresh = true;
    return true;
  }
  void end_branch() override {
    if (!sw_.active || sw_.branch < 0) throw Error("SWITCH branch end: no branch open");
    const int b = sw_.branch;
    const bool fresh = sw_.fresh;
    sw_.branch = -1;
    sw_.fresh = false;
    if (fresh) {
      cudaGraph_t g = nullptr;
      DG_CUDA_CHECK(cudaStreamEndCapture(branch_stream_, &g));  // g == the body: owned by the node
      branch_nodes_ += count_nodes(sw_.bodies[b]);
    }
  }
  void end_switch() override {
    if (!sw_.active || sw_.branch >= 0) throw Error("SWITCH node end: no SWITCH node open, or a branch still open");
    sw_ = {};
  }
  bool read_for_stats(void* dst, const void* src, std::size_t bytes) noexcept override {
    try {
      wait_last_step();
    } catch (...) {
      return false;
    }
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_) != cudaSuccess ||
        cudaStreamSynchronize(stream_) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return true;
  }
  void host_work(std::function<void()>) override {
    throw_invalid("StepContext::enqueue_host backend", "cuda", "host (on cuda, launch your work on stream())");
  }

 private:
  graphs::Graph take_graph() {
    if (!scope_) throw Error("cudaStreamEndCapture failed: no capture is active on the executor stream");
    // end() finishes the capture on every path; reset the scope whatever happens.
    struct Reset {
      std::optional<graphs::CaptureScope>& s;
      ~Reset() { s.reset(); }
    } reset{scope_};
    return scope_->end();
  }

  // Takes what earlier work left pending before one of our launches, and logs it (file comment).
  static void clear_leftover(const char* before) {
    const cudaError_t err = DG_CUDA_TAKE_PENDING(before);
    if (err != cudaSuccess) log_leftover(err, before);
  }

  // VMM memory (the driver hands out its allocation handle) or a memory pool's allocation.
  bool mapped_in_segments(const void* p) const {
    const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(p);
    CUmemoryPool pool = nullptr;
    if (drv_.pointer_attribute &&
        drv_.pointer_attribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr) == CUDA_SUCCESS && pool)
      return true;
    CUmemGenericAllocationHandle handle = 0;
    if (drv_.retain && drv_.release && drv_.retain(&handle, const_cast<void*>(p)) == CUDA_SUCCESS) {
      (void)drv_.release(handle);
      return true;
    }
    return false;
  }

  // The top level of the capture being recorded: ours on the own stream, or the caller's.
  cudaStream_t top() const { return recording_caller_ ? cur_ : stream_; }
  // The stream ops are recorded on: the branch stream while a SWITCH branch is being captured.
  cudaStream_t rec() const { return sw_.active && sw_.fresh ? branch_stream_ : top(); }

  // NOTE(graph): the band-select node sets every SWITCH handle created in its capture (ours, or the
  // caller's still in progress: changing a node's parameters is allowed then, see the file comment).
  static void set_band_select_handles(cudaGraphNode_t node, kernels::BandSelectParams params) {
    if (!node || params.num_handles == 0) return;
    cudaKernelNodeParams kp{};
    DG_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &kp));
    void* args[] = {&params};
    kp.kernelParams = args;
    kp.extra = nullptr;
    DG_CUDA_CHECK(cudaGraphKernelNodeSetParams(node, &kp));
  }

  // cudaGraphUpload on the step's stream (its first launch follows there, in order).
  void upload_graph(const graphs::GraphExec& e) { DG_CUDA_CHECK(cudaGraphUpload(e.get(), cur_)); }

  // enter_device for paths that must not throw (destructors, frees): the current device on failure.
  int bind_noexcept() noexcept {
    try {
      return enter_device();
    } catch (...) {
      return device_;
    }
  }

  void reset_switch_state() noexcept {
    sw_ = {};
    bs_ = {};
    graph_ = nullptr;
    branch_nodes_ = 0;
  }

  // Driver and runtime versions, then a graph with a SWITCH node (an empty node in each body) that
  // must instantiate, then the capture path end to end (probe_switch_capture). Outside any capture;
  // every error is cleared and reported, never thrown.
  static std::pair<bool, std::string> probe_switch() noexcept {
    int drv = 0, rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess || cudaRuntimeGetVersion(&rt) != cudaSuccess) {
      (void)cudaGetLastError();
      return {false, "cudaDriverGetVersion / cudaRuntimeGetVersion failed"};
    }
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    if (drv < 12080 || rt < 12080)
      return {false, "driver " + version(drv) + ", runtime " + version(rt) + "; SWITCH nodes need 12.8 or newer"};
    cudaGraph_t g = nullptr;
    cudaGraphExec_t e = nullptr;
    std::string failed;
    auto step = [&](cudaError_t err, const char* call) {
      if (err == cudaSuccess || !failed.empty()) return err == cudaSuccess && failed.empty();
      failed = std::string("probe: ") + call + " returned " + cudaGetErrorName(err);
      (void)cudaGetLastError();
      return false;
    };
    if (step(cudaGraphCreate(&g, 0), "cudaGraphCreate")) {
      cudaGraphConditionalHandle h = 0;
      cudaGraphNodeParams p{};
      cudaGraphNode_t n = nullptr;
      if (step(cudaGraphConditionalHandleCreate(&h, g, 0, 0), "cudaGraphConditionalHandleCreate")) {
        p.type = cudaGraphNodeTypeConditional;
        p.conditional.handle = h;
        p.conditional.type = cudaGraphCondTypeSwitch;
        p.conditional.size = 2;
        if (step(cudaGraphAddNode(&n, g, nullptr, nullptr, 0, &p), "cudaGraphAddNode(SWITCH)")) {
          for (int i = 0; i < 2; ++i) {
            cudaGraphNode_t empty = nullptr;
            step(cudaGraphAddEmptyNode(&empty, p.conditional.phGraph_out[i], nullptr, 0), "cudaGraphAddEmptyNode");
          }
          step(cudaGraphInstantiate(&e, g, 0), "cudaGraphInstantiate");
        }
      }
    }
    if (e) (void)cudaGraphExecDestroy(e);
    if (g) (void)cudaGraphDestroy(g);
    if (!failed.empty()) return {false, failed};
    failed = probe_switch_capture();
    if (!failed.empty()) return {false, failed};
    return {true, ""};
  }

  // The whole mechanism a bucket graph relies on, end to end, the way capture builds it: a stream
  // capture holding the band-select kernel; a SWITCH node added to the capture; branches 0 and 1
  // captured into their bodies from a second stream, branch 2 a child-graph clone of branch 0; the
  // handle patched into the captured kernel node; instantiate; two replays with lengths of bands 1
  // and 2, each checked by the value its branch wrote. The real calls, not the fault seam: a test's
  // injected fault is left for the code under test. Returns what failed, or "".
  static std::string probe_switch_capture() noexcept {
    (void)cudaGetLastError();  // a failed clean-up of probe_switch's graph: not this part's launches
    cudaStream_t s = nullptr, s2 = nullptr;
    int* d = nullptr;  // [0] the length, [1..3] band edges, [4] the mark a branch writes
    cudaGraph_t g = nullptr;
    cudaGraphExec_t e = nullptr;
    bool capturing = false, capturing2 = false;
    std::string failed;
    auto ok = [&](cudaError_t err, const char* call) {
      if (err == cudaSuccess) return true;
      failed = std::string("probe: ") + call + " returned " + cudaGetErrorName(err);
      return false;
    };
    do {
      if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") ||
          !ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") ||
          !ok(cudaMalloc(reinterpret_cast<void**>(&d), 8 * sizeof(int)), "cudaMalloc"))
        break;
      const int init[5] = {12, 8, 16, 24, -1};
      if (!ok(cudaMemcpyAsync(d, init, sizeof init, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync") ||
          !ok(cudaStreamSynchronize(s), "cudaStreamSynchronize"))
        break;
      if (!ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture")) break;
      capturing = true;
      kernels::BandSelectParams p;
      p.seq_lens = d;
      p.batch = 1;
      p.edges = d + 1;
      p.num_edges = 3;
      if (!ok(static_cast<cudaError_t>(kernels::launch_band_select_for_probe(p, s)), "band-select launch")) break;
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      cudaGraph_t cg = nullptr;
      const cudaGraphNode_t* deps = nullptr;
      const cudaGraphEdgeData* edges = nullptr;
      std::size_t ndeps = 0;
      if (!ok(cudaStreamGetCaptureInfo(s, &status, nullptr, &cg, &deps, &edges, &ndeps), "cudaStreamGetCaptureInfo"))
        break;
      if (status != cudaStreamCaptureStatusActive || ndeps != 1) {
        failed = "probe: the band-select kernel is not the capture's only dependency";
        break;
      }
      const cudaGraphNode_t select_node = deps[0];
      cudaGraphConditionalHandle h = 0;
      if (!ok(cudaGraphConditionalHandleCreate(&h, cg, 0, 0), "cudaGraphConditionalHandleCreate")) break;
      cudaGraphNodeParams np{};
      np.type = cudaGraphNodeTypeConditional;
      np.conditional.handle = h;
      np.conditional.type = cudaGraphCondTypeSwitch;
      np.conditional.size = 3;
      cudaGraphNode_t sw = nullptr;
      if (!ok(cudaGraphAddNode(&sw, cg, deps, edges, ndeps, &np), "cudaGraphAddNode(SWITCH) in a capture") ||
          !ok(cudaStreamUpdateCaptureDependencies(s, &sw, nullptr, 1, cudaStreamSetCaptureDependencies),
              "cudaStreamUpdateCaptureDependencies"))
        break;
      for (int b = 0; b < 2 && failed.empty(); ++b) {
        if (!ok(cudaStreamBeginCaptureToGraph(s2, np.conditional.phGraph_out[b], nullptr, nullptr, 0,
                                              cudaStreamCaptureModeThreadLocal),
                "cudaStreamBeginCaptureToGraph"))
          break;
        capturing2 = true;
        if (!ok(static_cast<cudaError_t>(kernels::launch_probe_mark(d + 4, 100 + b, s2)), "kernel launch in a body"))
          break;
        cudaGraph_t body = nullptr;
        capturing2 = false;
        ok(cudaStreamEndCapture(s2, &body), "cudaStreamEndCapture(body)");
      }
      if (!failed.empty()) break;
      cudaGraphNode_t child = nullptr;
      if (!ok(cudaGraphAddChildGraphNode(&child, np.conditional.phGraph_out[2], nullptr, 0,
                                         np.conditional.phGraph_out[0]),
              "cudaGraphAddChildGraphNode in a body"))
        break;
      capturing = false;
      if (!ok(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture")) break;
      cudaKernelNodeParams kp{};
      if (!ok(cudaGraphKernelNodeGetParams(select_node, &kp), "cudaGraphKernelNodeGetParams")) break;
      p.num_handles = 1;
      p.handles[0] = h;
      void* args[] = {&p};
      kp.kernelParams = args;
      kp.extra = nullptr;
      if (!ok(cudaGraphKernelNodeSetParams(select_node, &kp), "cudaGraphKernelNodeSetParams") ||
          !ok(cudaGraphInstantiate(&e, g, 0), "cudaGraphInstantiate"))
        break;
      // Length 12 is band 1 (its captured branch writes 101); 20 is band 2 (the clone of branch 0: 100).
      const int cases[2][2] = {{12, 101}, {20, 100}};
      for (const auto& c : cases) {
        int mark = -1;
        // All on s: a non-blocking stream is not ordered with the legacy stream's copies.
        if (!ok(cudaMemcpyAsync(d, &c[0], sizeof(int), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync") ||
            !ok(cudaMemsetAsync(d + 4, 0xff, sizeof(int), s), "cudaMemsetAsync") ||
            !ok(cudaGraphLaunch(e, s), "cudaGraphLaunch") ||
            !ok(cudaMemcpyAsync(&mark, d + 4, sizeof(int), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync") ||
            !ok(cudaStreamSynchronize(s), "cudaStreamSynchronize"))
          break;
        if (mark != c[1]) {
          failed = "probe: a length of band " + std::to_string(c[1] == 101 ? 1 : 2) + " ran the wrong SWITCH branch (wrote " +
                   std::to_string(mark) + ", expected " + std::to_string(c[1]) + ")";
          break;
        }
      }
    } while (false);
    if (capturing2) {
      cudaGraph_t body = nullptr;
      (void)cudaStreamEndCapture(s2, &body);
    }
    if (capturing) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(s, &partial);
      if (partial) (void)cudaGraphDestroy(partial);
    }
    if (e) (void)cudaGraphExecDestroy(e);
    if (g) (void)cudaGraphDestroy(g);
    if (d) (void)cudaFree(d);
    if (s2) (void)cudaStreamDestroy(s2);
    if (s) (void)cudaStreamDestroy(s);
    (void)cudaGetLastError();
    return failed;
  }

  // Waits for the last step on whichever stream it ran (an event: the caller may have destroyed
  // that stream meanwhile) and for the own stream.
  void drain() noexcept {
    if (last_ != stream_ && done_) (void)cudaEventSynchronize(done_);
    if (stream_) (void)cudaStreamSynchronize(stream_);
  }

  // Driver calls through the runtime's entry points, so libcuda need not be linked. Each is null
  // where the driver lacks it (and its check is then skipped).
  template <typename Fn>
  static Fn driver_entry_point(const char* name) noexcept {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<Fn>(fn);
  }
  void load_driver_entry_points() noexcept {
    drv_.get_range = driver_entry_point<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange");
    drv_.pointer_attribute = driver_entry_point<PFN_cuPointerGetAttribute_v4000>("cuPointerGetAttribute");
    drv_.retain = driver_entry_point<PFN_cuMemRetainAllocationHandle_v11000>("cuMemRetainAllocationHandle");
    drv_.release = driver_entry_point<PFN_cuMemRelease_v10020>("cuMemRelease");
  }

  void destroy() noexcept {
    for (cudaEvent_t e : timing_)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : staged_)
      if (e) cudaEventDestroy(e);
    if (done_) cudaEventDestroy(done_);
    if (branch_stream_) cudaStreamDestroy(branch_stream_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int device_ = 0;
  int sms_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t cur_ = nullptr;   // the running step's stream (stream_ between steps)
  cudaStream_t last_ = nullptr;  // the last finished step's stream; done_ marks its end unless it is stream_
  cudaEvent_t staged_[kStagingSlots] = {};  // per pinned mirror slot: its last staging copies
  cudaEvent_t done_ = nullptr;
  bool caller_ = false;            // the running step's stream is being captured by the caller
  bool recording_caller_ = false;  // begin_caller_capture .. end_caller_capture
  struct DriverCalls {
    PFN_cuMemGetAddressRange_v3020 get_range = nullptr;
    PFN_cuPointerGetAttribute_v4000 pointer_attribute = nullptr;
    PFN_cuMemRetainAllocationHandle_v11000 retain = nullptr;
    PFN_cuMemRelease_v10020 release = nullptr;
  } drv_;
  // A walk's cost stays bounded: 256 mappings are 5 GiB of PyTorch's 20 MiB expandable-segment pages
  // (512 MiB of 2 MiB ones), one cuMemGetAddressRange each, per buffer checked.
  static constexpr int kMaxMappingsWalked = 256;
  cudaEvent_t timing_[2] = {nullptr, nullptr};  // kMeasured: around the timed replays
  std::optional<graphs::CaptureScope> scope_;

  // kDevice capture state (reset when a capture ends or is aborted).
  struct BandSelectNode {
    cudaGraphNode_t node = nullptr;
    kernels::BandSelectParams params;
  };
  struct OpenSwitch {
    bool active = false;
    std::vector<cudaGraph_t> bodies;  // owned by the SWITCH node
    std::map<int, int> by_key;        // branch key -> the first branch recorded with it
    int branch = -1;
    bool fresh = false;               // the open branch is being captured on branch_stream_
  };
  cudaStream_t branch_stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;  // the graph being captured (cudaStreamGetCaptureInfo)
  BandSelectNode bs_;
  OpenSwitch sw_;
  int branch_nodes_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace decodegraph::detail
