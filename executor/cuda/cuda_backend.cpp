// CUDA backend: executor memory is cudaMalloc'd, staging mirrors are pinned, graphs are captured
// from a non-blocking stream the backend owns (graphs/) and instantiated once, and each step's
// staging and replay run on the caller's stream or, when none is given, on that same own stream.
//
// Ordering between steps: a step that runs on another stream than the previous one first waits
// (cudaStreamWaitEvent) for `done_`, an event marking the end of the previous step's work, so the
// static buffers every step shares are never rewritten under a running graph. On a caller's stream
// done_ is recorded at the end of each step; on the own stream it is recorded only when needed (a
// stream change, a sync point), which keeps the default path at the API calls it had.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <optional>
#include <string>
#include <utility>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "executor/backend.hpp"
#include "graphs/graph.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/occupancy.hpp"

namespace decodegraph::detail {
namespace {

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

class CudaCaptured final : public CapturedGraph {
 public:
  explicit CudaCaptured(graphs::Graph g) : graph(std::move(g)) {}
  graphs::Graph graph;
};

class CudaGraph final : public BackendGraph {
 public:
  CudaGraph(graphs::Graph g, graphs::GraphExec e) : graph_(std::move(g)), exec_(std::move(e)), nodes_(graph_.nodes()) {}
  int nodes() const override { return nodes_; }
  std::size_t bytes() const override { return graphs::estimate_graph_bytes(nodes_); }
  void launch(cudaStream_t s) const { exec_.launch(s); }
  /// True when updated in place; on a failed re-instantiation exec_ keeps the old graph.
  bool update(graphs::Graph g) {
    const bool in_place = exec_.update(g);
    nodes_ = g.nodes();
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
    cudaError_t err = cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreate(&timing_[0]);
    if (err == cudaSuccess) err = cudaEventCreate(&timing_[1]);
    if (err != cudaSuccess) {
      destroy();
      DG_CUDA_CHECK(err);
    }
    load_address_range();
  }
  ~CudaBackend() override {
    scope_.reset();
    drain();
    destroy();
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  Stream stream() const override { return stream_; }
  DeviceModel device_model(const AttentionSpec& spec) const override {
    DeviceModel d;
    d.num_sms = sms_;
    d.blocks_per_sm = kernels::pass1_blocks_per_sm_on_device(spec);
    return d;
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
    drain();
    cudaFree(p);
  }
  void* alloc_host(std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kAlloc)) injected("cudaMallocHost", fault::Site::kAlloc);
    void* p = nullptr;
    DG_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 256 : bytes));
    return p;
  }
  // A staging copy in flight may still read the pinned mirror.
  void free_host(void* p) noexcept override {
    drain();
    cudaFreeHost(p);
  }

  // ------------------------------------------------------------ the step's stream
  void begin_step(std::optional<Stream> s) override {
    cur_ = s ? *s : stream_;
    if (cur_ == last_) return;
    // NOTE(graph): consecutive steps share the staged buffers, the workspace and the flag; a step on
    // another stream must not start before the previous one is done with them.
    if (last_ == stream_) DG_CUDA_CHECK(cudaEventRecord(done_, stream_));  // recorded lazily on the own stream
    DG_CUDA_CHECK(cudaStreamWaitEvent(cur_, done_, 0));
  }
  void end_step() noexcept override {
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
  // The pinned mirrors are rewritten each step; wait until the previous step's copies have read
  // them. An event, not a stream: it holds whichever stream that step ran on.
  void wait_staging_reusable() override { DG_CUDA_CHECK(cudaEventSynchronize(staged_)); }
  void staging_done() override { DG_CUDA_CHECK(cudaEventRecord(staged_, cur_)); }

  AddressRange address_range(const void* p) const override {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    if (attr.type == cudaMemoryTypeUnregistered) return {AddressRange::kHostOnly, 0};
    if (!get_range_) return {};
    CUdeviceptr base = 0;
    std::size_t size = 0;
    const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(p);
    // Pointers the driver cannot place (host memory of another kind, say): nothing to check.
    if (get_range_(&base, &size, ptr) != CUDA_SUCCESS || ptr < base || ptr - base > size) return {};
    return {AddressRange::kDevice, static_cast<std::size_t>(base + size - ptr)};
  }

  void begin_capture() override {
    if (scope_) throw Error("cudaStreamBeginCapture failed: a capture is already active on the executor stream");
    scope_.emplace(stream_);
  }
  std::unique_ptr<CapturedGraph> end_capture() override {
    return std::make_unique<CudaCaptured>(take_graph());
  }
  std::unique_ptr<BackendGraph> instantiate(CapturedGraph& captured) override {
    graphs::Graph& g = static_cast<CudaCaptured&>(captured).graph;
    graphs::GraphExec e = graphs::GraphExec::instantiate(g);
    return std::make_unique<CudaGraph>(std::move(g), std::move(e));
  }
  bool update(BackendGraph& exec, CapturedGraph& captured) override {
    return static_cast<CudaGraph&>(exec).update(std::move(static_cast<CudaCaptured&>(captured).graph));
  }
  void abort_capture() noexcept override { scope_.reset(); }
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
  void attention_v1(const DecodeArgs& args) override { paged_attention_v1(args, stream_); }
  void attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                    std::size_t workspace_bytes) override {
    paged_attention_v2(args, partition_size, workspace, workspace_bytes, stream_);
  }
  void append(const AppendArgs& args) override { append_kv(args, stream_); }
  // Recorded into the graph: pinned destination, so it is a memcpy node, not a pageable copy.
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpyAsync", fault::Site::kMemcpy);
    DG_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
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

  // Waits for the last step on whichever stream it ran (an event: the caller may have destroyed
  // that stream meanwhile) and for the own stream.
  void drain() noexcept {
    if (last_ != stream_ && done_) (void)cudaEventSynchronize(done_);
    if (stream_) (void)cudaStreamSynchronize(stream_);
  }

  // cuMemGetAddressRange through the runtime's driver entry point, so libcuda need not be linked.
  void load_address_range() noexcept {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuMemGetAddressRange", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    get_range_ = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn);
  }

  void destroy() noexcept {
    for (cudaEvent_t e : timing_)
      if (e) cudaEventDestroy(e);
    if (staged_) cudaEventDestroy(staged_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int device_ = 0;
  int sms_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t cur_ = nullptr;   // the running step's stream (stream_ between steps)
  cudaStream_t last_ = nullptr;  // the last finished step's stream; done_ marks its end unless it is stream_
  cudaEvent_t staged_ = nullptr;
  cudaEvent_t done_ = nullptr;
  PFN_cuMemGetAddressRange_v3020 get_range_ = nullptr;
  cudaEvent_t timing_[2] = {nullptr, nullptr};  // kMeasured: around the timed replays
  std::optional<graphs::CaptureScope> scope_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace decodegraph::detail
