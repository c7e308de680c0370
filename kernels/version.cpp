// version.hpp (generated from cmake/version.hpp.in): the library's version and build flavour.
#include "decodegraph/version.hpp"

#ifndef DECODEGRAPH_HAS_CUDA
#error "DECODEGRAPH_HAS_CUDA must be defined by the build (CMakeLists.txt)"
#endif

namespace decodegraph {

const char* version() { return DECODEGRAPH_VERSION_STRING; }
bool built_with_cuda() { return DECODEGRAPH_HAS_CUDA != 0; }

}  // namespace decodegraph
