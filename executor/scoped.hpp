// Small scope guards and timing helpers the executor's parts share (internal).
#pragma once

#include <chrono>

#include "executor/backend.hpp"

namespace decodegraph::detail {

/// Ends an abandoned capture when the code being captured throws; disarm once it is ended normally.
struct AbortCapture {
  Backend* b;
  bool armed = true;
  ~AbortCapture() {
    if (armed) b->abort_capture();
  }
};

/// Calls end_step() when a step ends, also when it throws.
struct EndStep {
  Backend* b;
  ~EndStep() { b->end_step(); }
};

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace decodegraph::detail
