// NVTX ranges around capture and step (CUDA builds; nvtx3 is header-only). No-ops on host builds.
#pragma once

#if DECODEGRAPH_HAS_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace decodegraph::detail {

class NvtxRange {
 public:
#if DECODEGRAPH_HAS_CUDA
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
#else
  explicit NvtxRange(const char*) {}
#endif
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace decodegraph::detail
