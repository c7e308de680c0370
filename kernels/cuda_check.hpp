// CUDA error checking for library code: DG_CUDA_CHECK(call) throws naming the call, the CUDA error
// and the file:line; DG_CUDA_CHECK_LAUNCH(name) does the same for the launch just issued
// (cudaGetLastError). cudaErrorMemoryAllocation throws OutOfMemory, every other error CudaError
// (code and stickiness: error.hpp). Host-compilable: plain .cpp files may include it.
//
// cudaGetLastError returns the last error of any runtime call on this thread, not only of the launch
// before it: an error an earlier call left pending (the caller's, or a cudaErrorNotReady from an event
// query nobody cleared) would be blamed on our launch. So every entry point that launches first takes
// what is pending (DG_CUDA_TAKE_PENDING): a non-sticky error is cleared and handed back to be
// reported as the caller's (the CUDA backend logs it), a sticky one is thrown as lost context found
// before our launch. A failed call that DG_CUDA_CHECK throws for is cleared too, so it never turns
// up later as someone else's leftover.
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

/// The runtime's cudaGetLastError. A template parameter below, so that tests/api/test_cuda_check.cpp
/// can model a pending error without a device; library code always uses the default.
using LastErrorFn = cudaError_t (*)();

template <LastErrorFn kLastError = cudaGetLastError>
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  std::string msg = std::string(what) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                    ") at " + file + ":" + std::to_string(line);
  if (cuda_error_is_sticky(err)) {
    msg += "; the CUDA context is lost: later CUDA calls in this process will fail";
  } else {
    (void)kLastError();  // reported here: not left pending for a later launch check to find
  }
  if (static_cast<int>(err) == 2) throw OutOfMemory(msg);  // cudaErrorMemoryAllocation
  throw CudaError(msg, static_cast<int>(err));
}

/// Before a launch: takes the error earlier CUDA work on this thread left pending, so that the
/// check after the launch sees the launch's own error only. Returns a non-sticky one (cleared: the
/// caller of the entry point may report it, it is not ours); throws a sticky one (it cannot be
/// cleared, and the launch would fail on it), saying it came before `entry`. cudaSuccess: none.
template <LastErrorFn kLastError = cudaGetLastError>
cudaError_t take_pending_error(const char* entry, const char* file, int line) {
  const cudaError_t err = kLastError();
  if (err != cudaSuccess && cuda_error_is_sticky(err))
    throw_cuda_error<kLastError>(err, (std::string("CUDA work before ") + entry + " (not decodegraph's)").c_str(),
                                 file, line);
  return err;
}

/// After a launch (its entry point took what was pending before it): the launch's own error.
template <LastErrorFn kLastError = cudaGetLastError>
void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t err = kLastError();
  if (err != cudaSuccess) throw_cuda_error<kLastError>(err, (std::string("launch of ") + kernel).c_str(), file, line);
}

}  // namespace decodegraph::cuda_detail

#define DG_CUDA_CHECK(call)                                                               \
  do {                                                                                    \
    const cudaError_t dg_cuda_err_ = (call);                                              \
    if (dg_cuda_err_ != cudaSuccess)                                                      \
      ::decodegraph::cuda_detail::throw_cuda_error(dg_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks the launch just issued; `kernel` names it in the error. The entry point that leads to the
/// launch calls DG_CUDA_TAKE_PENDING first.
#define DG_CUDA_CHECK_LAUNCH(kernel) ::decodegraph::cuda_detail::check_launch(kernel, __FILE__, __LINE__)

/// At an entry point that launches (`entry` names it): takes, and evaluates to, the non-sticky error
/// earlier work left pending (cudaSuccess: none); throws on a sticky one.
#define DG_CUDA_TAKE_PENDING(entry) ::decodegraph::cuda_detail::take_pending_error(entry, __FILE__, __LINE__)
