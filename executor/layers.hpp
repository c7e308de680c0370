// Layers and their buffers (internal): the per-layer buffers the graphs bind, resolved (the caller's,
// or executor-owned q / out / new K / new V where the caller left them null), and the checks a layer
// list passes at construction and in rebind_layers.
#pragma once

#include <cstddef>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/backend.hpp"
#include "executor/memory.hpp"

namespace spdlog {
class logger;
}

namespace decodegraph::detail {

class LayerSet {
 public:
  /// Allocates nothing: resolve() does, on first need.
  LayerSet(const ExecutorConfig& config, Backend& backend, Allocations& memory, MemoryLedger& ledger);

  /// What the driver says about each caller buffer's allocation (CUDA; the host backend knows
  /// nothing and only the sizes given in LayerBuffers are checked, by check_layer_buffers). Throws
  /// InvalidArgument for host memory or an allocation too small for the spec.
  void check_device_ranges(const std::vector<LayerBuffers>& given) const;
  /// Host backend: warns (once per executor) when a layer gives no k_cache_bytes / v_cache_bytes,
  /// which is the only way this backend can tell a cache smaller than num_blocks blocks; CUDA asks
  /// the driver instead (check_device_ranges) and says nothing here.
  void warn_missing_cache_sizes(const std::vector<LayerBuffers>& given, spdlog::logger& log);
  /// Every check rebind_layers makes before it changes anything: the constructor's layer checks,
  /// the driver's ranges, and the memory budget for owned buffers not allocated yet (with
  /// `graph_bytes` of graphs held).
  void check_rebind(const std::vector<LayerBuffers>& given, std::size_t graph_bytes) const;
  /// Host backend (whose scales and sinks are host memory): every fp8 layer's k_scale / v_scale
  /// value finite and > 0, every sink a finite logit or -inf, else InvalidArgument naming the layer
  /// ("layers[2].v_scale[0] = nan ..."). At construction, in rebind_layers, and before every step
  /// runs anything (the caller may write new values between steps; the kernels would otherwise meet
  /// them mid-step). Nothing on CUDA, whose values are device memory the host does not read.
  void check_host_values(const std::vector<LayerBuffers>& given) const;
  /// Bytes of executor-owned layer buffers `given` needs that are not allocated yet.
  std::size_t owned_bytes_missing(const std::vector<LayerBuffers>& given) const;
  /// `given` with every null q/out/new K/V replaced by the layer's executor-owned buffer (allocated
  /// the first time it is needed, counted in the ledger's static bytes; contiguous). Owned buffers
  /// are kept when a rebind hands a layer's buffer to the caller, and reused when one hands it back.
  std::vector<LayerBuffers> resolve(const std::vector<LayerBuffers>& given);
  /// Makes `resolved` the layers in effect and returns the previous ones.
  std::vector<LayerBuffers> swap(std::vector<LayerBuffers> resolved);

  /// The buffers of layer l in effect (check_layer first where l is the caller's).
  const LayerBuffers& operator[](int l) const { return layers_[static_cast<std::size_t>(l)]; }
  /// Throws InvalidArgument unless 0 <= layer < num_layers.
  void check_layer(int layer) const;

 private:
  std::size_t q_bytes(int layer) const;         // an owned q (or out) of the layer's spec
  std::size_t kv_token_bytes(int layer) const;  // an owned new K (or V)

  const ExecutorConfig& cfg_;
  Backend& backend_;
  Allocations& memory_;
  MemoryLedger& ledger_;
  std::vector<LayerBuffers> layers_;  // resolved
  struct OwnedLayer {                 // null where the caller gives the buffer
    void* q = nullptr;
    void* out = nullptr;
    void* new_key = nullptr;
    void* new_value = nullptr;
  };
  std::vector<OwnedLayer> owned_;
  bool warned_sizes_ = false;
};

}  // namespace decodegraph::detail
