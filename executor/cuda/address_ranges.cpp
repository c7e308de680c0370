// Caller buffers' allocation ranges (address_ranges.hpp).
//
// A cudaMalloc allocation is one range and cuMemGetAddressRange gives its exact end. VMM memory
// (cuMemCreate + cuMemMap: PyTorch's expandable segments) and memory-pool allocations
// (cudaMallocAsync) may span several mappings, of which the driver reports only the one holding
// the pointer; so for them the mappings are walked, each adjacent to the last, up to the first
// unmapped byte (reading past it faults), for at most kMaxMappingsWalked mappings: past that the
// end is left unknown and nothing is rejected. A caller's k_cache_bytes is checked either way.
#include "executor/cuda/address_ranges.hpp"

#include <cuda_runtime.h>

#include <cstddef>

namespace decodegraph::detail {

AddressRange DriverAddressRanges::address_range(const void* p) const {
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

bool DriverAddressRanges::mapped_in_segments(const void* p) const {
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

template <typename Fn>
Fn DriverAddressRanges::driver_entry_point(const char* name) noexcept {
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

void DriverAddressRanges::load_driver_entry_points() noexcept {
  drv_.get_range = driver_entry_point<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange");
  drv_.pointer_attribute = driver_entry_point<PFN_cuPointerGetAttribute_v4000>("cuPointerGetAttribute");
  drv_.retain = driver_entry_point<PFN_cuMemRetainAllocationHandle_v11000>("cuMemRetainAllocationHandle");
  drv_.release = driver_entry_point<PFN_cuMemRelease_v10020>("cuMemRelease");
}

}  // namespace decodegraph::detail
