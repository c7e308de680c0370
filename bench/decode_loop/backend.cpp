#include "backend.hpp"

#include <cstring>

namespace dgloop {

#if DECODEGRAPH_HAS_CUDA
namespace {
cudaStream_t cuda(dg::Stream s) { return reinterpret_cast<cudaStream_t>(s); }
}  // namespace
#endif

void BackendOps::sync() const {
#if DECODEGRAPH_HAS_CUDA
  if (gpu) DGB_CUDA_CHECK(cudaStreamSynchronize(cuda(stream)));
#endif
}

void BackendOps::sync_device() const {
#if DECODEGRAPH_HAS_CUDA
  if (gpu) DGB_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

void BackendOps::to_device_async(void* dst, const void* src, std::size_t bytes) const {
#if DECODEGRAPH_HAS_CUDA
  if (gpu) {
    DGB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda(stream)));
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void BackendOps::to_host(void* dst, const void* src, std::size_t bytes) const {
#if DECODEGRAPH_HAS_CUDA
  if (gpu) {
    DGB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void BackendOps::fill(dg::DType dtype, void* p, std::size_t n, std::uint64_t seed) const {
#if DECODEGRAPH_HAS_CUDA
  if (gpu) {
    dgbench::fill_random_device(dtype, p, n, seed, cuda(stream));
    return;
  }
#endif
  dgbench::fill_random_host(dtype, p, n, seed);
}

void BackendOps::fill_kv(const dg::AttentionSpec& spec, void* p, std::size_t n, std::uint64_t seed) const {
#if DECODEGRAPH_HAS_CUDA
  if (gpu) {
    dgbench::fill_random_kv_device(spec, p, n, seed, cuda(stream));
    return;
  }
#endif
  dgbench::fill_random_kv_host(spec, p, n, seed);
}

Machine measure_machine(bool gpu) {
  Machine m;
#if DECODEGRAPH_HAS_CUDA
  if (gpu) {
    int dev = 0;
    DGB_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    DGB_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    m.name = prop.name;
    m.sms = prop.multiProcessorCount;
    m.read = dgbench::measure_read_bandwidth(dgbench::default_bandwidth_buffer_bytes(), 20);
    m.copy = dgbench::measure_copy_bandwidth(dgbench::default_bandwidth_buffer_bytes(), 10);
  }
#else
  (void)gpu;
#endif
  return m;
}

}  // namespace dgloop
