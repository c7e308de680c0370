// The delayed bad-block report (internal). Under ValidationLevel::kCheap block ids are not read on
// the host: the kernels clamp an id outside [0, num_blocks) and record the first one in a device int
// (DecodeArgs::bad_block). Each graph ends with a copy of that int into pinned memory, which the
// next step() or check_errors() reads without a CUDA call and turns into an InvalidArgument.
#pragma once

#include <cstddef>

#include "decodegraph/executor.hpp"
#include "executor/backend.hpp"
#include "executor/memory.hpp"

namespace decodegraph::detail {

class BadBlockReport {
 public:
  /// Device bytes of the flag.
  static constexpr std::size_t kDeviceBytes = sizeof(int);
  BadBlockReport(const ExecutorConfig& config, Backend& backend, Allocations& memory);

  /// NOTE(graph): the device flag every attention launch reports into (fixed address), and the
  /// pinned copy each graph writes last.
  int* device_flag() const { return flag_; }
  int* host_copy() const { return flag_h_; }
  /// Throws InvalidArgument, and clears the report, if a step since the last report read a bad id.
  /// `wait`: wait for the last step first (check_errors); otherwise only read what has landed, and
  /// wait only when there is something to report. `steps`: the steps run so far.
  void report(bool wait, long long steps);
  long long reports() const { return reports_; }

 private:
  const ExecutorConfig& cfg_;
  Backend& backend_;
  int* flag_ = nullptr;
  int* flag_h_ = nullptr;
  long long reported_through_ = 0;  // steps up to here were covered by the last report
  long long reports_ = 0;
};

}  // namespace decodegraph::detail
