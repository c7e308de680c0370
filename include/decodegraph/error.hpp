// decodegraph's exceptions. Everything the library throws is a decodegraph::Error; catching Error
// catches all of it. Its subclasses tell an engine what happened and what it can do:
//
//   InvalidArgument  the caller's input or configuration was rejected before anything ran; the
//                    executor is unchanged and usable. Fix the input. The message names the
//                    parameter, the value and what is allowed, e.g.
//                    "head_size = 100 is invalid; allowed: 64, 80, 96, 112, 128, 192, 256".
//   CorruptedStepReport (an InvalidArgument; catch it first) an EARLIER step, under
//                    ValidationLevel::kCheap, read a bad block id or was given a wrong slot, and the
//                    kernels clamped or skipped it: one sequence's output (or its new K/V) at that
//                    step is wrong. Thrown by the next step() (which then ran nothing: resubmit it)
//                    or check_errors(). Re-prefill the sequence it names; the executor is usable.
//   OutOfMemory      a device allocation (cudaErrorMemoryAllocation) or a host allocation failed;
//                    nothing half-built is kept. Free memory or shrink the configuration and retry.
//   CudaError        any other CUDA call failed. code() is the cudaError_t value; context_lost()
//                    is true for the "sticky" errors (an illegal address, a failed launch, a device
//                    assert, ...) after which every later CUDA call in the process fails: the only
//                    recovery is a new process. Otherwise the executor stays usable.
//
// A plain Error (none of the three) is a broken internal invariant, or CUDA work asked of a build
// without CUDA. Failures injected through fault.hpp are OutOfMemory at Site::kAlloc and a CudaError
// with code kInjectedFaultCode (not sticky) at every other site.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace decodegraph {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad input: everything throw_invalid() and require() raise.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The delayed report of a bad block id or a wrong slot (see the top of this file). Its inputs were
/// valid for everything kCheap checks on the host; the kernels found the mistake while the step ran,
/// clamped the block id (the output of that sequence is wrong) or skipped the append (its new K/V
/// was not written), and recorded the first such mistake. Steps are counted as ExecutorStats::steps
/// counts them (successful step() calls, from 1).
class CorruptedStepReport : public InvalidArgument {
 public:
  enum class Kind : int {
    kBadBlockId = 0,     // block_tables[sequence][block_table_column] outside [0, num_blocks)
    kSlotMismatch = 1,   // slot_mapping[sequence] is not the slot of position seq_len - 1 (q_len > 1: an
                         // entry (sequence, j) not that of position seq_len - q_len + j)
    kSlotPastCache = 2,  // slot_mapping[sequence] >= num_blocks * block_size
  };
  CorruptedStepReport(const std::string& what, Kind kind, long long first_step, long long last_step,
                      bool step_refused, int sequence, int block_table_column)
      : InvalidArgument(what),
        kind_(kind),
        first_step_(first_step),
        last_step_(last_step),
        step_refused_(step_refused),
        sequence_(sequence),
        block_table_column_(block_table_column) {}
  Kind kind() const noexcept { return kind_; }
  /// The steps one of which made the mistake: those since the previous report (first == last when
  /// errors are checked after every step).
  long long first_step() const noexcept { return first_step_; }
  long long last_step() const noexcept { return last_step_; }
  /// True when step() threw it: that call ran nothing, so submit its inputs again. False from
  /// check_errors().
  bool step_refused() const noexcept { return step_refused_; }
  /// The row of that step's inputs (its sequence index), or -1 when not recorded (a table entry past
  /// INT_MAX).
  int sequence() const noexcept { return sequence_; }
  /// kBadBlockId: the block-table column; -1 otherwise (or not recorded).
  int block_table_column() const noexcept { return block_table_column_; }

 private:
  Kind kind_;
  long long first_step_, last_step_;
  bool step_refused_;
  int sequence_, block_table_column_;
};
const char* to_string(CorruptedStepReport::Kind kind);

/// A device or host allocation failed.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

/// True for the cudaError_t values after which the CUDA context is lost for the whole process
/// ("sticky": illegal address, launch failure, device assert, uncorrectable ECC, ...).
bool cuda_error_is_sticky(int code);

/// The cudaError_t value an injected fault (fault.hpp) reports: cudaErrorUnknown.
inline constexpr int kInjectedFaultCode = 999;

/// A CUDA call failed with code() (a cudaError_t value as an int; never cudaErrorMemoryAllocation,
/// which is OutOfMemory).
class CudaError : public Error {
 public:
  CudaError(const std::string& what, int code)
      : Error(what), code_(code), context_lost_(cuda_error_is_sticky(code)) {}
  int code() const noexcept { return code_; }
  /// The error is sticky: every later CUDA call in this process fails too; restart the process.
  bool context_lost() const noexcept { return context_lost_; }

 private:
  int code_;
  bool context_lost_;
};

namespace detail {
template <typename T>
std::string to_text(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace detail

/// Throws InvalidArgument("<param> = <value> is invalid; allowed: <allowed>").
template <typename T>
[[noreturn]] void throw_invalid(std::string_view param, const T& value, std::string_view allowed) {
  throw InvalidArgument(std::string(param) + " = " + detail::to_text(value) + " is invalid; allowed: " +
                        std::string(allowed));
}

/// Checks `ok`; otherwise throws as throw_invalid does.
template <typename T>
void require(bool ok, std::string_view param, const T& value, std::string_view allowed) {
  if (!ok) throw_invalid(param, value, allowed);
}

}  // namespace decodegraph
