// Layers and their buffers (layers.hpp).
#include "executor/layers.hpp"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>
#include <utility>

#include "decodegraph/error.hpp"
#include "executor/config_checks.hpp"
#include "executor/layer_groups.hpp"
#include "executor/log.hpp"
#include "executor/plan.hpp"
#include "kernels/validate.hpp"

namespace decodegraph::detail {

LayerSet::LayerSet(const ExecutorConfig& config, Backend& backend, Allocations& memory, MemoryLedger& ledger)
    : cfg_(config), backend_(backend), memory_(memory), ledger_(ledger), owned_(config.num_layers) {}

std::size_t LayerSet::q_bytes(int l) const {
  const AttentionSpec& s = layer_spec(cfg_, l);
  return max_rows(cfg_) * s.num_q_heads * s.head_size * dtype_size(s.dtype);  // [max_batch, max q_len] rows
}

std::size_t LayerSet::kv_token_bytes(int l) const {
  const AttentionSpec& s = layer_spec(cfg_, l);
  return max_rows(cfg_) * s.num_kv_heads * s.head_size * dtype_size(s.dtype);
}

void LayerSet::check_layer(int layer) const {
  if (layer < 0 || layer >= cfg_.num_layers)
    throw_invalid("layer", layer, "0..num_layers-1 = 0.." + std::to_string(cfg_.num_layers - 1));
}

void LayerSet::check_device_ranges(const std::vector<LayerBuffers>& given) const {
  const std::size_t esize = dtype_size(cfg_.spec.dtype);  // every layer's (validate_layer_specs)
  // Rows of a strided buffer: the last one starts (max_rows - 1) strides in.
  const int64_t rows = static_cast<int64_t>(max_rows(cfg_));
  auto rows_bytes = [&](int64_t stride, int64_t row) {
    const int64_t s = stride != 0 ? stride : row;
    return static_cast<std::size_t>((rows - 1) * s + row) * esize;
  };
  auto rows_text = [&](std::size_t bytes) {
    const std::string what = max_q_len(cfg_) == 1
                                 ? "max_batch = " + std::to_string(cfg_.max_batch)
                                 : "max_batch x the largest q_len = " + std::to_string(cfg_.max_batch) + " x " +
                                       std::to_string(max_q_len(cfg_));
    return "at least " + what + " rows at its stride = " + std::to_string(bytes) + " bytes";
  };
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const LayerBuffers& lb = given[l];
    const std::string p = "layers[" + std::to_string(l) + "].";
    const AttentionSpec& spec = layer_spec(cfg_, l);  // each layer's buffers follow its own spec
    const std::size_t need_cache = cache_bytes_needed(cfg_, l);
    const int64_t q_row = static_cast<int64_t>(spec.num_q_heads) * spec.head_size;
    const int64_t kv_row = static_cast<int64_t>(spec.num_kv_heads) * spec.head_size;
    const std::string cache_text = "at least num_blocks x block bytes = " + std::to_string(cfg_.num_blocks) + " x " +
                                   std::to_string(spec.block_bytes()) + " = " + std::to_string(need_cache) +
                                   " bytes";
    auto check = [&](const void* ptr, const char* name, std::size_t need, const std::string& need_text) {
      if (ptr == nullptr) return;
      const AddressRange r = backend_.address_range(ptr);
      if (r.kind == AddressRange::kHostOnly)
        throw_invalid(p + name, ptr_text(ptr), "device memory (this is host memory the GPU cannot read)");
      if (r.kind == AddressRange::kDevice && r.bytes_from_ptr < need)
        throw_invalid(p + name,
                      ptr_text(ptr) + " with " + std::to_string(r.bytes_from_ptr) +
                          " bytes to the end of its allocation (cuMemGetAddressRange)",
                      need_text);
    };
    check(lb.k_cache, "k_cache", need_cache, cache_text);
    check(lb.v_cache, "v_cache", need_cache, cache_text);
    const std::size_t qb = rows_bytes(lb.q_stride, q_row), ob = rows_bytes(lb.out_stride, q_row);
    const std::size_t kb = rows_bytes(lb.new_key_stride, kv_row), vb = rows_bytes(lb.new_value_stride, kv_row);
    check(lb.q, "q", qb, rows_text(qb));
    check(lb.out, "out", ob, rows_text(ob));
    check(lb.new_key, "new_key", kb, rows_text(kb));
    check(lb.new_value, "new_value", vb, rows_text(vb));
    if (spec.fp8_kv()) {
      const std::size_t sb = sizeof(float) * static_cast<std::size_t>(spec.kv_scale_count());
      const std::string st = "at least " + std::to_string(sb) + " bytes (spec.kv_scale_count() fp32 values)";
      check(lb.k_scale, "k_scale", sb, st);
      check(lb.v_scale, "v_scale", sb, st);
    }
    if (lb.sinks != nullptr) {
      const std::size_t kb = sizeof(float) * static_cast<std::size_t>(spec.num_q_heads);
      check(lb.sinks, "sinks", kb, "at least " + std::to_string(kb) + " bytes (num_q_heads fp32 values)");
    }
  }
}

void LayerSet::warn_missing_cache_sizes(const std::vector<LayerBuffers>& given, spdlog::logger& log) {
  if (warned_sizes_ || backend_.kind() != BackendKind::kHost) return;
  int first = -1, missing = 0;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    if (given[l].k_cache_bytes != 0 && given[l].v_cache_bytes != 0) continue;
    if (first < 0) first = l;
    ++missing;
  }
  if (missing == 0) return;
  warned_sizes_ = true;
  log.warn("layers[{}].k_cache_bytes / v_cache_bytes not given ({} of {} layers lack them): the host backend "
           "cannot ask for an allocation's size, so a cache smaller than num_blocks = {} blocks ({} bytes) would "
           "be read and written out of bounds, unchecked. Give every layer's k_cache_bytes and v_cache_bytes "
           "(docs/integration.md, \"Cache sizes\"). Warned once per executor.",
           first, missing, cfg_.num_layers, cfg_.num_blocks, cache_bytes_needed(cfg_, first));
}

void LayerSet::check_host_values(const std::vector<LayerBuffers>& given) const {
  if (backend_.kind() != BackendKind::kHost) return;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const LayerBuffers& lb = given[static_cast<std::size_t>(l)];
    const AttentionSpec& spec = layer_spec(cfg_, l);
    if (!spec.fp8_kv() && lb.sinks == nullptr) continue;  // most layers: nothing to read
    try {
      check_host_scales(spec, lb.k_scale, lb.v_scale);
      check_host_sinks(spec, lb.sinks);
    } catch (const InvalidArgument& e) {
      // The value check's own message ("v_scale[0] = nan is invalid; ..."), with its layer.
      throw InvalidArgument("layers[" + std::to_string(l) + "]." + e.what() +
                            " (read at every step: write a valid value before the next one)");
    }
  }
}

void LayerSet::check_rebind(const std::vector<LayerBuffers>& given, std::size_t graph_bytes) const {
  check_layer_buffers(given, cfg_);
  check_device_ranges(given);
  const std::size_t extra = owned_bytes_missing(given);
  if (ledger_.budget == 0 || extra == 0) return;
  const std::size_t total = ledger_.static_bytes + ledger_.workspace_bytes + graph_bytes + extra;
  if (total > ledger_.budget)
    throw_invalid("memory_budget_bytes", ledger_.budget,
                  ">= " + std::to_string(total) +
                      " bytes to own the layer buffers left null in rebind_layers, or 0 for unlimited");
}

std::size_t LayerSet::owned_bytes_missing(const std::vector<LayerBuffers>& given) const {
  std::size_t n = 0;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const LayerBuffers& lb = given[l];
    const OwnedLayer& o = owned_[l];
    if (!lb.q && !o.q) n += q_bytes(l);
    if (!lb.out && !o.out) n += q_bytes(l);
    if (!lb.new_key && !o.new_key) n += kv_token_bytes(l);
    if (!lb.new_value && !o.new_value) n += kv_token_bytes(l);
  }
  return n;
}

std::vector<LayerBuffers> LayerSet::resolve(const std::vector<LayerBuffers>& given) {
  std::vector<LayerBuffers> out = given;
  auto own = [&](void*& slot, void*& owned, std::size_t bytes) {
    if (slot) return;
    if (!owned) {
      owned = memory_.device(bytes);
      ledger_.static_bytes += bytes;
    }
    slot = owned;
  };
  for (int l = 0; l < cfg_.num_layers; ++l) {
    OwnedLayer& o = owned_[l];
    own(out[l].q, o.q, q_bytes(l));
    own(out[l].out, o.out, q_bytes(l));
    own(out[l].new_key, o.new_key, kv_token_bytes(l));
    own(out[l].new_value, o.new_value, kv_token_bytes(l));
  }
  return out;
}

std::vector<LayerBuffers> LayerSet::swap(std::vector<LayerBuffers> resolved) {
  return std::exchange(layers_, std::move(resolved));
}

}  // namespace decodegraph::detail
