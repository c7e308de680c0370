// CUDA error checking for library code: DG_CUDA_CHECK(call) throws naming the call, the CUDA error
// and the file:line; DG_CUDA_CHECK_LAUNCH(name) does the same for the launch just issued
// (cudaGetLastError). cudaErrorMemoryAllocation throws OutOfMemory, every other error CudaError
// (code and stickiness: error.hpp). Host-compilable: plain .cpp files may include it.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "decodegraph/error.hpp"

namespace decodegraph::cuda_detail {

// cuda_error_is_sticky (kernels/common.cpp) lists codes by number so host-only builds have it too.
// Checked against the real headers only: the CPU simulator's shim (tests/sim) defines a few codes.
#ifdef CUDART_VERSION
static_assert(cudaErrorMemoryAllocation == 2, "cudaErrorMemoryAllocation changed");
static_assert(cudaErrorECCUncorrectable == 214 && cudaErrorContained == 226 &&
              cudaErrorIllegalAddress == 700 && cudaErrorLaunchTimeout == 702 && cudaErrorAssert == 710 &&
              cudaErrorHardwareStackError == 714 && cudaErrorIllegalInstruction == 715 &&
              cudaErrorMisalignedAddress == 716 && cudaErrorInvalidAddressSpace == 717 &&
              cudaErrorInvalidPc == 718 && cudaErrorLaunchFailure == 719 && cudaErrorExternalDevice == 911,
              "the sticky cudaError_t values in kernels/common.cpp no longer match the CUDA headers");
static_assert(cudaErrorUnknown == kInjectedFaultCode, "kInjectedFaultCode must be cudaErrorUnknown");
#endif

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  std::string msg = std::string(what) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                    ") at " + file + ":" + std::to_string(line);
  if (static_cast<int>(err) == 2) throw OutOfMemory(msg);  // cudaErrorMemoryAllocation
  if (cuda_error_is_sticky(err)) msg += "; the CUDA context is lost: later CUDA calls in this process will fail";
  throw CudaError(msg, static_cast<int>(err));
}

inline void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw_cuda_error(err, (std::string("launch of ") + kernel).c_str(), file, line);
}

}  // namespace decodegraph::cuda_detail

#define DG_CUDA_CHECK(call)                                                               \
  do {                                                                                    \
    const cudaError_t dg_cuda_err_ = (call);                                              \
    if (dg_cuda_err_ != cudaSuccess)                                                      \
      ::decodegraph::cuda_detail::throw_cuda_error(dg_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks the launch just issued; `kernel` names it in the error.
#define DG_CUDA_CHECK_LAUNCH(kernel) ::decodegraph::cuda_detail::check_launch(kernel, __FILE__, __LINE__)
