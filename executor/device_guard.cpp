// The host backend's device-guard counters (device_guard.hpp).
#include "executor/device_guard.hpp"

namespace decodegraph::detail {
namespace {

// Per thread, not atomic: an executor's calls and the test reading them are on one thread, and a
// step on the host backend should not pay for locked increments.
thread_local HostDeviceGuardCounts t_counts;

}  // namespace

void count_host_device_entry() { ++t_counts.entered; }
void count_host_device_exit() { ++t_counts.left; }
void count_host_unbound_op() { ++t_counts.unbound_ops; }

HostDeviceGuardCounts host_device_guard_counts() { return t_counts; }

}  // namespace decodegraph::detail
