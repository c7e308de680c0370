// The device model (device_model.hpp): the host backend's H200, the bounds a given model must be
// within, and a given model completed from the device's.
#include "executor/device_model.hpp"

#include <string>

#include "decodegraph/error.hpp"
#include "kernels/occupancy.hpp"

namespace decodegraph {
namespace {

constexpr int kMaxSms = 65536;
constexpr int kMaxBlocksPerSm = 64;

}  // namespace

namespace detail {

void check_device_model(const DeviceModel& d, const char* source) {
  const std::string what = std::string("0 (") + source + ") or ";
  require(d.num_sms >= 0 && d.num_sms <= kMaxSms, "device_model.num_sms", d.num_sms,
          what + "1.." + std::to_string(kMaxSms));
  require(d.blocks_per_sm >= 0 && d.blocks_per_sm <= kMaxBlocksPerSm, "device_model.blocks_per_sm",
          d.blocks_per_sm, what + "1.." + std::to_string(kMaxBlocksPerSm));
}

DeviceModel fill_device_model(const DeviceModel& given, const AttentionSpec& spec,
                              const std::function<DeviceModel(const AttentionSpec&)>& device, const std::string& whose) {
  DeviceModel m = given;
  if (m.num_sms != 0 && m.blocks_per_sm != 0) return m;
  const DeviceModel d = device(spec);
  if (m.num_sms == 0) m.num_sms = d.num_sms;
  if (m.blocks_per_sm == 0) m.blocks_per_sm = d.blocks_per_sm;
  // What the device reported must make sense too (a pass-1 block that does not fit reports 0).
  require(m.num_sms >= 1, "device_model.num_sms", m.num_sms, ">= 1 (as queried from the device" + whose + ")");
  require(m.blocks_per_sm >= 1, "device_model.blocks_per_sm", m.blocks_per_sm,
          ">= 1 (as queried from the device" + whose + ": the pass-1 kernel does not fit on an SM)");
  return m;
}

}  // namespace detail

DeviceModel host_device_model(const AttentionSpec& spec) {
  DeviceModel d;
  d.num_sms = 132;  // H200 SXM
  d.blocks_per_sm = kernels::blocks_per_sm(kernels::pass1_resources(spec));
  return d;
}

}  // namespace decodegraph
