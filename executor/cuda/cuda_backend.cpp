// CUDA backend (cuda_backend.hpp): executor memory is cudaMalloc'd, staging mirrors are pinned, graphs
// are captured from a non-blocking stream the backend owns (graphs/) and instantiated once, and each
// step's staging and replay run on the caller's stream or, when none is given, on that same own
// stream. This file holds construction, the device, the step's stream and the ops.
//
// Ordering between steps: a step that runs on another stream than the previous one first waits
// (cudaStreamWaitEvent) for `done_`, an event marking the end of the previous step's work, so the
// static buffers every step shares are never rewritten under a running graph. On a caller's stream
// done_ is recorded at the end of each step; on the own stream it is recorded only when needed (a
// stream change, a sync point), which keeps the default path at the API calls it had.
//
// A caller's capture: when begin_step finds the step's stream being captured by someone else (an
// engine capturing its forward pass), nothing is ordered on it (no event waits or records: an event
// recorded into a capture cannot be waited on outside it) and the step's work is recorded into that
// capture: ops go to the caller's stream instead of ours (top()), and the band-select node and the
// SWITCH nodes are added to the caller's capture graph exactly as to ours (cuda_switch.cpp). No graph
// of ours is captured, instantiated or launched then.
//
// Programmatic dependent launch (ExecutorConfig::programmatic_launch): the executor asks once
// whether the device has it (compute capability 9.0+) and then flags every op; each op keeps the
// flag only when every node the capture will make it depend on is a kernel node (ours or the
// caller's): capture turns such a launch into programmatic edges (cudaGraphDependencyTypeProgrammatic,
// which CUDA allows between kernel nodes only). After a staging copy, an event join, a SWITCH node,
// or as the first node of a SWITCH branch (no dependency inside its body) the launch is plain: a
// full dependency, exactly as without PDL. Our kernels wait (griddepcontrol.wait) before any global
// access, so a programmatic edge from a caller's kernel is as safe as one from ours.
//
// Launch checks: an error that earlier CUDA work on this thread left pending is taken before each
// of our launches and logged as not ours (clear_leftover), so it is neither blamed on a launch nor
// cached as the SWITCH probe's answer (kernels/cuda_check.hpp).
//
// The device: captured at construction (the current device). Every entry point binds it through
// enter_device/leave_device (executor/device_guard.hpp); the destructor and the frees, which also run
// from destructors, bind it themselves.
#include "executor/cuda/cuda_backend.hpp"

#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "decodegraph/error.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/occupancy.hpp"

namespace decodegraph::detail {

void log_leftover(cudaError_t err, const char* before) {
  if (auto log = spdlog::get("decodegraph"))
    log->warn("a CUDA error that earlier work on this thread left pending, {} ({}), was found before {}; it is "
              "not decodegraph's (check your own launches), and was cleared",
              cudaGetErrorName(err), cudaGetErrorString(err), before);
}

// ------------------------------------------------------------ construction

CudaBackend::CudaBackend() {
  DG_CUDA_CHECK(cudaGetDevice(&device_));
  DG_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_));
  DG_CUDA_CHECK(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device_));
  DG_CUDA_CHECK(cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, device_));
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
  ranges_.load_driver_entry_points();
}

CudaBackend::~CudaBackend() {
  const int previous = bind_noexcept();
  scope_.reset();
  drain();
  destroy();
  leave_device(previous);
}

DeviceModel CudaBackend::device_model(const AttentionSpec& spec) const {
  DeviceModel d;
  d.num_sms = sms_;
  d.blocks_per_sm = kernels::pass1_blocks_per_sm_on_device(spec);
  return d;
}

// ------------------------------------------------------------ the executor's device

int CudaBackend::enter_device() {
  int previous = 0;
  DG_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != device_) DG_CUDA_CHECK(cudaSetDevice(device_));
  return previous;
}

void CudaBackend::leave_device(int previous) noexcept {
  if (previous == device_) return;
  const cudaError_t err = cudaSetDevice(previous);
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  if (auto log = spdlog::get("decodegraph"))
    log->warn("could not make device {} current again after an executor call on device {}: {}", previous, device_,
              cudaGetErrorName(err));
}

// enter_device for paths that must not throw (destructors, frees): the current device on failure.
int CudaBackend::bind_noexcept() noexcept {
  try {
    return enter_device();
  } catch (...) {
    return device_;
  }
}

// ------------------------------------------------------------ the step's stream

void CudaBackend::begin_step(std::optional<Stream> s) {
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

void CudaBackend::end_step() noexcept {
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

void CudaBackend::wait_last_step() {
  if (last_ == stream_) {
    DG_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  DG_CUDA_CHECK(cudaEventSynchronize(done_));
}

// Waits for the last step on whichever stream it ran (an event: the caller may have destroyed
// that stream meanwhile) and for the own stream.
void CudaBackend::drain() noexcept {
  if (last_ != stream_ && done_) (void)cudaEventSynchronize(done_);
  if (stream_) (void)cudaStreamSynchronize(stream_);
}

// ------------------------------------------------------------ ops

// The eager launchers are capturable and check kKernelLaunch and cudaGetLastError themselves.
// They go to the stream being captured: the own stream, or the branch stream inside a SWITCH branch.
// A step body's own launches may run in between: what they left pending is logged first.
void CudaBackend::attention_v1(const DecodeArgs& args) {
  clear_leftover("paged_attention_v1");
  DecodeArgs a = args;
  a.programmatic_launch = args.programmatic_launch && after_kernel_nodes(rec());
  paged_attention_v1(a, rec());
}

// The merge follows pass 1 on the same stream: always a kernel-to-kernel edge.
void CudaBackend::attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                               std::size_t workspace_bytes) {
  clear_leftover("paged_attention_v2");
  DecodeArgs a = args;
  a.programmatic_launch = args.programmatic_launch && after_kernel_nodes(rec());
  paged_attention_v2(a, partition_size, workspace, workspace_bytes, rec());
}

void CudaBackend::append(const AppendArgs& args) {
  clear_leftover("append_kv");
  AppendArgs a = args;
  a.programmatic_launch = args.programmatic_launch && after_kernel_nodes(rec());
  append_kv(a, rec());
}

bool CudaBackend::programmatic_launch_supported(std::string& why) const {
  if (cc_major_ >= 9) return true;
  why = "device " + std::to_string(device_) + " has compute capability " + std::to_string(cc_major_) + "." +
        std::to_string(cc_minor_) + "; programmatic dependent launch needs 9.0 or newer";
  return false;
}

// File comment, "Programmatic dependent launch". Outside a capture (never the case for the
// executor's launches, which are all recorded) the runtime orders a launch after a non-kernel
// fully by itself.
bool CudaBackend::after_kernel_nodes(cudaStream_t s) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;  // given, so that edge data on a dependency is no lossy query
  std::size_t ndeps = 0;
  DG_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, nullptr, &deps, &edges, &ndeps));
  if (status != cudaStreamCaptureStatusActive) return true;
  if (ndeps == 0) return false;  // the first node of a capture or of a SWITCH branch
  for (std::size_t i = 0; i < ndeps; ++i) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    DG_CUDA_CHECK(cudaGraphNodeGetType(deps[i], &type));
    if (type != cudaGraphNodeTypeKernel) return false;
  }
  return true;
}

void CudaBackend::host_work(std::function<void()>) {
  throw_invalid("StepContext::enqueue_host backend", "cuda", "host (on cuda, launch your work on stream())");
}

// Takes what earlier work left pending before one of our launches, and logs it (file comment).
void CudaBackend::clear_leftover(const char* before) {
  const cudaError_t err = DG_CUDA_TAKE_PENDING(before);
  if (err != cudaSuccess) log_leftover(err, before);
}

// ------------------------------------------------------------ teardown

void CudaBackend::destroy() noexcept {
  for (cudaEvent_t e : timing_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : staged_)
    if (e) cudaEventDestroy(e);
  if (done_) cudaEventDestroy(done_);
  if (branch_stream_) cudaStreamDestroy(branch_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace decodegraph::detail
