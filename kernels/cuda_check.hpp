// CUDA error checking for library code: DG_CUDA_CHECK(call) throws decodegraph::Error naming the
// call, the CUDA error and the file:line; DG_CUDA_CHECK_LAUNCH(name) does the same for the launch
// just issued (cudaGetLastError). Host-compilable: plain .cpp files may include it.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "decodegraph/error.hpp"

namespace decodegraph::cuda_detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw Error(std::string(what) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
              ") at " + file + ":" + std::to_string(line));
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
