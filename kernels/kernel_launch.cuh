// One launch path for the kernels the graphs hold (pass 1, the merge, the append):
// cudaLaunchKernelEx, with programmatic stream serialization (programmatic dependent launch, PDL)
// when asked. Such a kernel may start while the kernel before it in the stream drains; each of
// ours calls dev::grid_dependency_wait() before it touches global memory (docs/design.md, "The
// graph contract"), so the attribute is safe after any predecessor, ours or the caller's. Stream
// capture records it as a programmatic edge to a kernel node; the CUDA backend sets it only when
// every capture dependency is a kernel node (cuda_backend.cpp). Under the CPU simulator the shim
// provides cudaLaunchKernelEx and models the overlap (tests/sim/README.md).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_check.hpp"

namespace decodegraph::kernels {

template <typename P>
void launch_kernel(void (*kernel)(P), dim3 grid, dim3 block, cudaStream_t stream, bool programmatic, const P& params,
                   const char* name) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, params);
  if (err != cudaSuccess)
    cuda_detail::throw_cuda_error(err, (std::string("launch of ") + name).c_str(), __FILE__, __LINE__);
  DG_CUDA_CHECK_LAUNCH(name);  // an error the launch left pending (a bad configuration, on some drivers)
}

}  // namespace decodegraph::kernels
