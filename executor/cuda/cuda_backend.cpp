// CUDA backend: executor memory is cudaMalloc'd, staging mirrors are pinned, steps run on one
// non-blocking stream owned by the backend, and a bucket's ops are captured from that stream into a
// cudaGraph_t (graphs/) and instantiated once.
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

class CudaGraph final : public BackendGraph {
 public:
  CudaGraph(graphs::Graph g, graphs::GraphExec e) : graph_(std::move(g)), exec_(std::move(e)), nodes_(graph_.nodes()) {}
  int nodes() const override { return nodes_; }
  std::size_t bytes() const override { return graphs::estimate_graph_bytes(nodes_); }
  void launch(cudaStream_t s) const { exec_.launch(s); }
  void update(graphs::Graph g) {
    exec_.update(g);
    nodes_ = g.nodes();
    graph_ = std::move(g);
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
    cudaError_t err = cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreate(&timing_[0]);
    if (err == cudaSuccess) err = cudaEventCreate(&timing_[1]);
    if (err != cudaSuccess) {
      destroy();
      DG_CUDA_CHECK(err);
    }
  }
  ~CudaBackend() override {
    scope_.reset();
    cudaStreamSynchronize(stream_);
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
  // Work still queued on stream_ (a replay, a staging copy) may read the buffer: drain it first.
  void free(void* p) noexcept override {
    cudaStreamSynchronize(stream_);
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
    cudaStreamSynchronize(stream_);
    cudaFreeHost(p);
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
                                  stream_));
    DG_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void stage_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                std::size_t rows, MemorySpace space) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpy2DAsync", fault::Site::kMemcpy);
    if (width == 0 || rows == 0) return;
    const cudaMemcpyKind kind = space == MemorySpace::kDevice ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    if (rows == 1)
      DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, width, kind, stream_));
    else
      DG_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind, stream_));
  }
  void stage_fill(void* dst, int byte, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemsetAsync", fault::Site::kMemcpy);
    if (bytes) DG_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, stream_));
  }
  // The pinned mirrors are rewritten each step; wait until the previous step's copies have read them.
  void wait_staging_reusable() override { DG_CUDA_CHECK(cudaEventSynchronize(staged_)); }
  void staging_done() override { DG_CUDA_CHECK(cudaEventRecord(staged_, stream_)); }

  void begin_capture() override {
    if (scope_) throw Error("cudaStreamBeginCapture failed: a capture is already active on the executor stream");
    scope_.emplace(stream_);
  }
  std::unique_ptr<BackendGraph> end_capture_and_instantiate() override {
    graphs::Graph g = take_graph();
    graphs::GraphExec e = graphs::GraphExec::instantiate(g);
    return std::make_unique<CudaGraph>(std::move(g), std::move(e));
  }
  void abort_capture() noexcept override { scope_.reset(); }
  void end_capture_and_update(BackendGraph& exec) override {
    graphs::Graph g = take_graph();
    static_cast<CudaGraph&>(exec).update(std::move(g));
  }
  void launch(BackendGraph& g) override { static_cast<CudaGraph&>(g).launch(stream_); }
  double time_replays(BackendGraph& g, int replays) override {
    // Never inside a capture: event timing and the synchronisation below are not capturable.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    DG_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
    if (scope_ || status != cudaStreamCaptureStatusNone)
      throw Error("kMeasured timing refused: the executor stream is being captured");
    launch(g);  // warm-up
    DG_CUDA_CHECK(cudaEventRecord(timing_[0], stream_));
    for (int i = 0; i < replays; ++i) launch(g);
    DG_CUDA_CHECK(cudaEventRecord(timing_[1], stream_));
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

  void destroy() noexcept {
    for (cudaEvent_t e : timing_)
      if (e) cudaEventDestroy(e);
    if (staged_) cudaEventDestroy(staged_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int device_ = 0;
  int sms_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t staged_ = nullptr;
  cudaEvent_t timing_[2] = {nullptr, nullptr};  // kMeasured: around the timed replays
  std::optional<graphs::CaptureScope> scope_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace decodegraph::detail
