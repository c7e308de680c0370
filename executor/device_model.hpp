// The device model (internal): what the planner assumes about the GPU (DeviceModel: SMs and resident
// pass-1 blocks per SM). The host backend's model of an H200 is host_device_model (public); a model
// given in ExecutorConfig is checked against these bounds, and its zero fields are filled from the
// device's (docs/planning.md, "The device model"). Host-only, no backend.
#pragma once

#include <functional>
#include <string>

#include "decodegraph/executor.hpp"

namespace decodegraph::detail {

/// Checks a given model's fields: each 0 (`source` fills it: "the device's, ...") or within what
/// any GPU has (1..65536 SMs, 1..64 blocks per SM). Throws InvalidArgument naming device_model.<field>.
void check_device_model(const DeviceModel& given, const char* source);

/// `given` with its zero fields from `device(spec)` (called only when one is 0), each checked >= 1;
/// `whose` ends the error text ("as queried from the device" + whose).
DeviceModel fill_device_model(const DeviceModel& given, const AttentionSpec& spec,
                              const std::function<DeviceModel(const AttentionSpec&)>& device, const std::string& whose);

}  // namespace decodegraph::detail
