// A stand-in for the CUDA runtime that launches nothing: it records, for every kernel launch the
// library's launchers make, the kernel's mangled device name, grid, block and dynamic shared
// memory, and hands them to the probe (probe.cpp) while the launch arguments are still alive.
// Linked instead of cudart, so the probe runs on a machine without a GPU or a driver.
//
// It defines only what the launchers of kernels/inst/*.cu reach today plus the calls a launcher
// with dynamic shared memory needs (cudaFuncSetAttribute, cudaLaunchKernelExC, device attributes).
// A launcher that calls anything else fails to link, naming the symbol: add it here.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <map>

#include "fake_cudart.hpp"

namespace {

struct CallConfig {
  dim3 grid, block;
  size_t smem = 0;
  void* stream = nullptr;
};

std::map<const void*, const char*>& names() {  // host stub -> mangled device name
  static std::map<const void*, const char*> m;
  return m;
}
CallConfig g_config;
cudaError_t g_last = cudaSuccess;
int g_fake_handle = 0;

void record(const void* host_fun, dim3 grid, dim3 block, size_t smem, void** args) {
  const auto it = names().find(host_fun);
  FakeLaunch launch;
  launch.kernel = it == names().end() ? nullptr : it->second;
  launch.grid[0] = grid.x, launch.grid[1] = grid.y, launch.grid[2] = grid.z;
  launch.block[0] = block.x, launch.block[1] = block.y, launch.block[2] = block.z;
  launch.dynamic_smem = smem;
  launch.args = args;
  fake_cudart_on_launch(launch);
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- registration (nvcc's host stubs)
void** __cudaRegisterFatBinary(void*) { return reinterpret_cast<void**>(&g_fake_handle); }
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char* host_fun, char*, const char* device_name, int, uint3*, uint3*,
                            dim3*, dim3*, int*) {
  names()[host_fun] = device_name;
}
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
void __cudaRegisterManagedVar(void**, void**, char*, const char*, int, size_t, int, int) {}
char __cudaInitModule(void**) { return 0; }

// ---------------------------------------------------------------- launches
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t smem, void* stream) {
  g_config = CallConfig{grid, block, smem, stream};
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* smem, void* stream) {
  *grid = g_config.grid;
  *block = g_config.block;
  *smem = g_config.smem;
  *static_cast<void**>(stream) = g_config.stream;
  return cudaSuccess;
}
// CUDA 13's stubs resolve a cudaKernel_t once; the fake hands back the host stub itself.
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_fun) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(host_fun));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t smem, cudaStream_t) {
  record(reinterpret_cast<const void*>(kernel), grid, block, smem, args);
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                    cudaStream_t) {
  record(reinterpret_cast<const void*>(kernel), grid, block, smem, args);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t smem, cudaStream_t) {
  record(func, grid, block, smem, args);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  record(func, config->gridDim, config->blockDim, config->dynamicSmemBytes, args);
  return cudaSuccess;
}

// ---------------------------------------------------------------- errors
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_last;
  g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last; }
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorNotSupported"; }
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "not supported by the kernel report's fake runtime";
}

// ---------------------------------------------------------------- attributes and device queries
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    const auto it = names().find(func);
    fake_cudart_on_smem_optin(it == names().end() ? nullptr : it->second, value);
  }
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
// An H200 (sm_90), for launchers that size themselves from the device.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 232448; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 49152; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 233472; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    default: return g_last = cudaErrorNotSupported;
  }
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int*, const void*, int, size_t, unsigned) {
  return g_last = cudaErrorNotSupported;
}

}  // extern "C"
