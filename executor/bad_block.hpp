// The delayed report (internal). Under ValidationLevel::kCheap block ids and slots are not read on
// the host: the attention kernels clamp an id outside [0, num_blocks) and the append skips a slot
// that is past the cache or not that of its position, and the first of either is recorded in one
// device int (DecodeArgs::bad_block: positive codes; AppendArgs::bad_slot: negative ones, see
// kernels/append_report.hpp). Each graph ends with a copy of that int into pinned memory, which the
// next step() or check_errors() reads without a CUDA call and turns into a CorruptedStepReport.
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
  /// Throws CorruptedStepReport, and clears the report, if a step since the last report read a bad
  /// id or skipped a slot. `wait`: wait for the last step first (check_errors); otherwise only read
  /// what has landed, and wait only when there is something to report. `steps`: the steps run so
  /// far. `from_step`: step() asks, and runs nothing when this throws.
  void report(bool wait, long long steps, bool from_step);
  /// A step of `q_len` tokens per sequence ran: the append reports a token index t of its
  /// [batch, q_len] slots, which names sequence t / q_len when every step since the last report had
  /// that q_len.
  void note_step(int q_len) { q_since_ = q_since_ == 0 || q_since_ == q_len ? q_len : -1; }
  long long reports() const { return reports_; }

 private:
  const ExecutorConfig& cfg_;
  Backend& backend_;
  int* flag_ = nullptr;
  int* flag_h_ = nullptr;
  long long reported_through_ = 0;  // steps up to here were covered by the last report
  long long reports_ = 0;
  int q_since_ = 0;  // the q_len of every step since the last report; 0: none, -1: they differed
};

}  // namespace decodegraph::detail
