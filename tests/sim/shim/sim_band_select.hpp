// Simulator model of device-side conditional-node control (kernels/band_select.cu):
// cudaGraphSetConditional records the value set for each handle, which tests read back with
// sim::conditional_value(). Only the kernel's side exists here; there is no graph to switch.
#pragma once

#include <map>

#include "sim_runtime.hpp"

using cudaGraphConditionalHandle = unsigned long long;

namespace sim {
// handle -> the last value set; tests clear it between launches.
inline std::map<unsigned long long, unsigned>& conditional_values() {
  static std::map<unsigned long long, unsigned> values;
  return values;
}
}  // namespace sim

// Threads never run concurrently in the simulator, so the map needs no lock.
inline void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned value) {
  sim::conditional_values()[handle] = value;
}
