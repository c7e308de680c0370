// decodegraph's exceptions. Everything the library throws is a decodegraph::Error; catching Error
// catches all of it. Three subclasses tell an engine what happened and what it can do:
//
//   InvalidArgument  the caller's input or configuration was rejected before anything ran; the
//                    executor is unchanged and usable. Fix the input. The message names the
//                    parameter, the value and what is allowed, e.g.
//                    "head_size = 100 is invalid; allowed: 64, 80, 96, 112, 128, 192, 256".
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
