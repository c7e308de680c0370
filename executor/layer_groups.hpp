// Layer groups (internal): ExecutorConfig::layer_specs checked, and the layers whose specs are equal
// gathered into groups, numbered in the order of their first layer. Each group is planned on its own
// (the plan book keeps a plan per (group, batch bucket, band)), with the device model of its own
// pass-1 kernel (its occupancy follows the head size and the GQA group); every layer's launch
// follows its group's plan. Host-only, no backend.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "decodegraph/executor.hpp"

namespace decodegraph::detail {

/// Layer l's spec: config.layer_specs[l], or config.spec when layer_specs is empty.
const AttentionSpec& layer_spec(const ExecutorConfig& config, int layer);

/// The longest sliding window of any layer, or 0 when some layer has none: every block-table entry
/// some layer reads lies from math::window_origin(len, widest_window, block_size) on.
int widest_window(const ExecutorConfig& config);

struct LayerGroup {
  AttentionSpec spec;
  DeviceModel device_model;  // resolved for the group's pass-1 kernel
  std::vector<int> layers;   // ascending
};

class LayerGroups {
 public:
  /// The groups of `resolved` (checked by validate_layer_specs). Group 0, layer 0's, takes
  /// resolved.device_model (resolve_config fills it for layer 0's spec); every other group takes
  /// the fields `given` (the caller's device_model) sets and asks `device(spec)` for the others.
  LayerGroups(const ExecutorConfig& resolved, const DeviceModel& given,
              const std::function<DeviceModel(const AttentionSpec&)>& device);

  int size() const { return static_cast<int>(groups_.size()); }
  const LayerGroup& operator[](int group) const { return groups_[static_cast<std::size_t>(group)]; }
  int group_of(int layer) const { return group_of_[static_cast<std::size_t>(layer)]; }
  const AttentionSpec& spec_of(int layer) const { return groups_[static_cast<std::size_t>(group_of(layer))].spec; }
  /// What group `group` is planned with: `resolved` with the group's spec and device model, and
  /// num_layers its layer count (kMeasured's predictions time the group's layers); no layers.
  ExecutorConfig planning_config(const ExecutorConfig& resolved, int group) const;

 private:
  std::vector<LayerGroup> groups_;
  std::vector<int> group_of_;  // [num_layers]
};

/// "0-4, 6-10" or "5..59 step 6": a group's layers, short.
std::string layer_list_text(const std::vector<int>& layers);
/// One line naming group `index`'s layers and spec, for the plan table.
std::string describe_layer_group(int index, const LayerGroup& group);

}  // namespace decodegraph::detail
