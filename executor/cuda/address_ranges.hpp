// Caller buffers' allocation ranges, asked of the driver (internal): the CUDA backend's
// address_range (backend.hpp, AddressRange), which layers.cpp checks caller buffers against.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "executor/backend.hpp"

namespace decodegraph::detail {

class DriverAddressRanges {
 public:
  /// Driver calls through the runtime's entry points, so libcuda need not be linked. Each is null
  /// where the driver lacks it (and its check is then skipped).
  void load_driver_entry_points() noexcept;
  /// What the driver can tell about the allocation behind `p` (address_ranges.cpp says how).
  AddressRange address_range(const void* p) const;

 private:
  // VMM memory (the driver hands out its allocation handle) or a memory pool's allocation.
  bool mapped_in_segments(const void* p) const;
  template <typename Fn>
  static Fn driver_entry_point(const char* name) noexcept;

  struct DriverCalls {
    PFN_cuMemGetAddressRange_v3020 get_range = nullptr;
    PFN_cuPointerGetAttribute_v4000 pointer_attribute = nullptr;
    PFN_cuMemRetainAllocationHandle_v11000 retain = nullptr;
    PFN_cuMemRelease_v10020 release = nullptr;
  } drv_;
  // A walk's cost stays bounded: 256 mappings are 5 GiB of PyTorch's 20 MiB expandable-segment pages
  // (512 MiB of 2 MiB ones), one cuMemGetAddressRange each, per buffer checked.
  static constexpr int kMaxMappingsWalked = 256;
};

}  // namespace decodegraph::detail
