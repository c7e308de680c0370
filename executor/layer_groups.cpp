// Layer groups (layer_groups.hpp).
#include "executor/layer_groups.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "decodegraph/error.hpp"
#include "executor/device_model.hpp"

namespace decodegraph::detail {

const AttentionSpec& layer_spec(const ExecutorConfig& c, int layer) {
  return c.layer_specs.empty() ? c.spec : c.layer_specs[static_cast<std::size_t>(layer)];
}

int widest_window(const ExecutorConfig& c) {
  int widest = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const int w = layer_spec(c, l).sliding_window;
    if (w == 0) return 0;
    widest = std::max(widest, w);
  }
  return widest;
}

}  // namespace decodegraph::detail

namespace decodegraph {

// What may differ per layer is what shapes one layer's own tensors and math: its heads, head size,
// scale, KV cache dtype (and fp8 scales per KV head), window and soft-cap. What every layer shares
// is what the step's inputs and the engine's buffers share: one block table and slot mapping per
// sequence, one activation dtype, one cache layout (docs/features.md, "Per layer", which
// FeatureClaims.TableMatchesTheCode checks against this function).
void validate_layer_specs(const ExecutorConfig& c) {
  if (c.layer_specs.empty()) return;
  require(static_cast<int>(c.layer_specs.size()) == c.num_layers, "layer_specs.size()", c.layer_specs.size(),
          "0 (every layer uses spec) or num_layers = " + std::to_string(c.num_layers) + " (one spec per layer)");
  for (std::size_t l = 0; l < c.layer_specs.size(); ++l) {
    const AttentionSpec& s = c.layer_specs[l];
    const std::string p = "layer_specs[" + std::to_string(l) + "]";
    try {
      validate_spec(s);
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();  // "head_size = ...", or "spec.scale = ..."
      throw InvalidArgument(p + "." + (what.rfind("spec.", 0) == 0 ? what.substr(5) : what));
    }
    if (s.block_size != c.spec.block_size)
      throw_invalid(p + ".block_size", s.block_size,
                    "spec.block_size = " + std::to_string(c.spec.block_size) +
                        " (every layer shares the block tables and the slot mapping)");
    if (s.dtype != c.spec.dtype)
      throw_invalid(p + ".dtype", to_string(s.dtype),
                    std::string("spec.dtype = ") + to_string(c.spec.dtype) + " (the model's dtype, every layer's)");
    if (s.layout != c.spec.layout)
      throw_invalid(p + ".layout", to_string(s.layout),
                    std::string("spec.layout = ") + to_string(c.spec.layout) + " (one cache layout for every layer)");
  }
}

std::vector<int> layer_groups_of(const ExecutorConfig& c) {
  validate_layer_specs(c);
  std::vector<int> group_of;
  std::vector<const AttentionSpec*> first;  // each group's spec, in the order of its first layer
  for (int l = 0; l < c.num_layers; ++l) {
    const AttentionSpec& s = detail::layer_spec(c, l);
    std::size_t g = 0;
    while (g < first.size() && !(*first[g] == s)) ++g;
    if (g == first.size()) first.push_back(&s);
    group_of.push_back(static_cast<int>(g));
  }
  return group_of;
}

}  // namespace decodegraph

namespace decodegraph::detail {

LayerGroups::LayerGroups(const ExecutorConfig& c, const DeviceModel& given,
                         const std::function<DeviceModel(const AttentionSpec&)>& device)
    : group_of_(layer_groups_of(c)) {
  // One group (spec's) even without layers: plan_buckets plans a config whose layers are not given.
  groups_.push_back(LayerGroup{layer_spec(c, 0), c.device_model, {}});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::size_t g = static_cast<std::size_t>(group_of_[static_cast<std::size_t>(l)]);
    if (g == groups_.size()) {
      const AttentionSpec& s = layer_spec(c, l);
      groups_.push_back(LayerGroup{
          s, fill_device_model(given, s, device, " for layer group " + std::to_string(g) + ", layer " + std::to_string(l)),
          {}});
    }
    groups_[g].layers.push_back(l);
  }
}

ExecutorConfig LayerGroups::planning_config(const ExecutorConfig& resolved, int group) const {
  ExecutorConfig c = resolved;
  const LayerGroup& g = (*this)[group];
  c.spec = g.spec;
  c.device_model = g.device_model;
  c.num_layers = static_cast<int>(g.layers.size());
  c.layers.clear();
  c.layer_specs.clear();
  return c;
}

std::string layer_list_text(const std::vector<int>& v) {
  if (v.empty()) return "none";
  const std::size_t n = v.size();
  if (n >= 3 && v[1] - v[0] > 1) {  // an arithmetic progression (Gemma 3's every sixth layer)
    bool even = true;
    for (std::size_t i = 2; i < n && even; ++i) even = v[i] - v[i - 1] == v[1] - v[0];
    if (even)
      return std::to_string(v[0]) + ".." + std::to_string(v[n - 1]) + " step " + std::to_string(v[1] - v[0]);
  }
  std::string s;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j + 1 < n && v[j + 1] == v[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(v[i]);
    if (j > i) s += "-" + std::to_string(v[j]);
    i = j + 1;
  }
  return s;
}

std::string describe_layer_group(int index, const LayerGroup& g) {
  const AttentionSpec& s = g.spec;
  char b[192];
  std::snprintf(b, sizeof b, "%d q / %d kv heads of %d, %s, %s, scale %.6g%s; target %d blocks", s.num_q_heads,
                s.num_kv_heads, s.head_size, to_string(s.dtype), to_string(s.layout), s.effective_scale(),
                s.scale == 0 ? " (1/sqrt(head_size))" : "", g.device_model.target_blocks());
  return "layer group " + std::to_string(index) + ": " + std::to_string(g.layers.size()) + " layer" +
         (g.layers.size() == 1 ? "" : "s") + " (" + layer_list_text(g.layers) + "): " + b;
}

}  // namespace decodegraph::detail
