#pragma once

namespace decodegraph {
/// "MAJOR.MINOR.PATCH"
const char* version();
/// True when the library was built with CUDA kernels and the CUDA backend.
bool built_with_cuda();
}  // namespace decodegraph
