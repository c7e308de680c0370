// Configuration checks (internal): an ExecutorConfig checked and completed before anything is planned
// or allocated, the sizes every later part reads off the resolved config, and the checks of
// per-layer buffers that construction and rebind_layers share. Host-only, no backend.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "decodegraph/executor.hpp"

namespace decodegraph::detail {

/// The fields planning reads, checked, with defaults filled in (band edges, batch buckets), and the
/// layer specs (validate_layer_specs). The device model is checked but left as given. Throws Error naming the parameter, the value and what
/// is allowed.
ExecutorConfig resolve_planning(ExecutorConfig config);

/// Everything resolve_planning does, plus the fields only an Executor needs (layers, caches, blocks,
/// capture, validation, ...) and max_blocks_per_seq; device-model fields left at 0 are taken from
/// `device(spec)` for layer 0's spec (layer group 0), which is called at most once and only when one
/// is 0 (LayerGroups resolves the other groups' models).
ExecutorConfig resolve_config(ExecutorConfig config,
                              const std::function<DeviceModel(const AttentionSpec&)>& device);

/// "[1, 4]": a list of ints as error messages name it.
std::string list_text(const std::vector<int>& values);

/// The largest of a resolved config's q_lens (they are ascending), and the query rows that many
/// tokens per sequence of max_batch sequences take: what q/out, new K/V and the staged slots hold.
inline int max_q_len(const ExecutorConfig& resolved) { return resolved.q_lens.back(); }
inline std::size_t max_rows(const ExecutorConfig& resolved) {
  return static_cast<std::size_t>(resolved.max_batch) * max_q_len(resolved);
}

/// Bytes layer `layer`'s K (or V) cache needs: num_blocks blocks of its spec.
std::size_t cache_bytes_needed(const ExecutorConfig& resolved, int layer);

/// The host-side checks of per-layer buffers (ExecutorConfig::layers, Executor::rebind_layers):
/// count, caches present, row strides (0, or >= a row and a multiple of 16 bytes, only for caller
/// buffers) and cache sizes where given. Throws InvalidArgument naming layers[l].<field>.
void check_layer_buffers(const std::vector<LayerBuffers>& layers, const ExecutorConfig& resolved);

}  // namespace decodegraph::detail
