// The executor's device (internal): every public entry point that reaches the backend runs on the
// device the executor was built on and gives the caller's current device back when it returns or
// throws, so one thread can drive executors on several GPUs (docs/executor.md, "Several devices").
//
// DeviceScope is the guard each entry point opens; DeviceTeardown does the same for destruction,
// where the backend outlives every other part of the executor (executor_impl.hpp).
#pragma once

#include "executor/backend.hpp"

namespace decodegraph::detail {

/// Binds the executor's device for the scope (Backend::enter_device / leave_device).
class DeviceScope {
 public:
  explicit DeviceScope(Backend& b) : b_(b), previous_(b.enter_device()) {}
  ~DeviceScope() { b_.leave_device(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Backend& b_;
  int previous_;
};

/// Executor::Impl's member declared right after the backend: its destructor binds the device first
/// (bind()), the members declared after this one are destroyed on it, and this member's destructor
/// gives the caller's device back before the backend itself goes (whose destructor binds on its own).
class DeviceTeardown {
 public:
  DeviceTeardown() = default;
  DeviceTeardown(const DeviceTeardown&) = delete;
  DeviceTeardown& operator=(const DeviceTeardown&) = delete;
  /// Never throws: where the device cannot be bound, teardown runs on the current one.
  void bind(Backend& b) noexcept {
    try {
      previous_ = b.enter_device();
      b_ = &b;
    } catch (...) {
    }
  }
  ~DeviceTeardown() {
    if (b_) b_->leave_device(previous_);
  }

 private:
  Backend* b_ = nullptr;
  int previous_ = 0;
};

/// The host backend's record of device-guard use on this thread (tests check that every entry point
/// binds the device and every operation runs bound).
struct HostDeviceGuardCounts {
  long long entered = 0;    // enter_device calls
  long long left = 0;       // leave_device calls
  long long unbound_ops = 0;  // backend operations that ran with no enter_device open
};
HostDeviceGuardCounts host_device_guard_counts();
/// The host backend's side of the counters.
void count_host_device_entry();
void count_host_device_exit();
void count_host_unbound_op();

/// The host backend's open device guards, shared by its parts (host_backend.cpp, host_recording.hpp):
/// enter_device / leave_device go through enter() / leave(), and each operation calls bound().
class HostDeviceDepth {
 public:
  void enter() {
    ++depth_;
    count_host_device_entry();
  }
  void leave() noexcept {
    --depth_;
    count_host_device_exit();
  }
  // Counts an operation that ran with no device guard open.
  void bound() const {
    if (depth_ <= 0) count_host_unbound_op();
  }

 private:
  int depth_ = 0;  // device guards open
};

}  // namespace decodegraph::detail
