// The CUDA backend's memory and copies (cuda_backend.hpp): executor memory is cudaMalloc'd and zeroed
// on the own stream, staging mirrors are pinned host memory, uploads and downloads are synchronous,
// and the staging copies are ordered on the step's stream. A free first waits for work still queued
// that may read the buffer.
//
// Staging ring: one event per pinned mirror slot (staging_ring.hpp), queried to find a slot whose
// copies are done, and waited on only when none is.
#include "executor/cuda/cuda_backend.hpp"

#include <cuda_runtime.h>

#include <cstddef>

#include "decodegraph/fault.hpp"
#include "kernels/cuda_check.hpp"

namespace decodegraph::detail {
namespace {

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

}  // namespace

// ------------------------------------------------------------ memory

void* CudaBackend::alloc(std::size_t bytes) {
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
void CudaBackend::free(void* p) noexcept {
  const int previous = bind_noexcept();
  drain();
  cudaFree(p);
  leave_device(previous);
}

void* CudaBackend::alloc_host(std::size_t bytes) {
  if (fault::should_fail(fault::Site::kAlloc)) injected("cudaMallocHost", fault::Site::kAlloc);
  void* p = nullptr;
  DG_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 256 : bytes));
  return p;
}

// A staging copy in flight may still read the pinned mirror.
void CudaBackend::free_host(void* p) noexcept {
  const int previous = bind_noexcept();
  drain();
  cudaFreeHost(p);
  leave_device(previous);
}

// ------------------------------------------------------------ copies

void CudaBackend::upload(void* dst, const void* src, std::size_t bytes) {
  if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpyAsync", fault::Site::kMemcpy);
  DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  DG_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::download(void* dst, const void* src, std::size_t bytes, MemorySpace space) {
  if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpyAsync", fault::Site::kMemcpy);
  DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                                space == MemorySpace::kDevice ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost,
                                cur_));
  DG_CUDA_CHECK(cudaStreamSynchronize(cur_));
}

void CudaBackend::stage_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                           std::size_t rows, MemorySpace space) {
  if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpy2DAsync", fault::Site::kMemcpy);
  if (width == 0 || rows == 0) return;
  const cudaMemcpyKind kind = space == MemorySpace::kDevice ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
  if (rows == 1)
    DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, width, kind, cur_));
  else
    DG_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind, cur_));
}

void CudaBackend::stage_fill(void* dst, int byte, std::size_t bytes) {
  if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemsetAsync", fault::Site::kMemcpy);
  if (bytes) DG_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, cur_));
}

// Recorded into the graph: pinned destination, so it is a memcpy node, not a pageable copy.
void CudaBackend::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (fault::should_fail(fault::Site::kMemcpy)) injected("cudaMemcpyAsync", fault::Site::kMemcpy);
  DG_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, rec()));
}

bool CudaBackend::read_for_stats(void* dst, const void* src, std::size_t bytes) noexcept {
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

// ------------------------------------------------------------ the staging ring

// A pinned mirror slot is rewritten when its turn comes again; wait until the copies that last read
// it are done. An event, not a stream: it holds whichever stream that step ran on.
void CudaBackend::wait_staging_reusable(int slot) { DG_CUDA_CHECK(cudaEventSynchronize(staged_[slot])); }

void CudaBackend::staging_done(int slot) { DG_CUDA_CHECK(cudaEventRecord(staged_[slot], cur_)); }

bool CudaBackend::staging_reusable_now(int slot) {
  const cudaError_t err = cudaEventQuery(staged_[slot]);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: never left pending for a later launch check
    return false;
  }
  DG_CUDA_CHECK(err);
  return true;
}

}  // namespace decodegraph::detail
