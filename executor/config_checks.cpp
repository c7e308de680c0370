// Configuration checks (config_checks.hpp): every field an Executor (resolve_config) or the planner
// alone (resolve_planning) reads, checked before anything is planned or allocated, with the
// defaults filled in (config_defaults.cpp) and the device model completed (device_model.cpp). Each
// error names the parameter, the value and what is allowed (docs/bad-input.md).
#include "executor/config_checks.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "executor/device_model.hpp"
#include "executor/layer_groups.hpp"
#include "executor/log.hpp"

namespace decodegraph {

namespace detail {
std::string list_text(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}
}  // namespace detail

namespace {

using detail::list_text;

void check_increasing(const std::vector<int>& v, const char* name, const char* last_name, int last) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] <= 0)
      throw_invalid(std::string(name) + "[" + std::to_string(i) + "]", v[i], "positive values");
    if (i > 0 && v[i] <= v[i - 1])
      throw_invalid(name, list_text(v), "strictly increasing values");
  }
  if (v.empty() || v.back() != last)
    throw_invalid(name, list_text(v), std::string("a list ending at ") + last_name + " = " + std::to_string(last));
}

// ExecutorConfig::q_lens: non-empty, each 1..kMaxQLen and at most max_seq_len, no duplicates;
// returned ascending (config() shows them so, and plans follow that order).
std::vector<int> checked_q_lens(std::vector<int> q, int max_seq_len) {
  const std::string allowed = "1..kMaxQLen = 1.." + std::to_string(kMaxQLen) + " query tokens per sequence";
  if (q.empty()) throw_invalid("q_lens", "[] (empty)", "a list of distinct q_lens, each " + allowed + "; {1} without drafts");
  for (std::size_t i = 0; i < q.size(); ++i) {
    require(q[i] >= 1 && q[i] <= kMaxQLen, "q_lens[" + std::to_string(i) + "]", q[i], allowed);
    require(q[i] <= max_seq_len, "q_lens[" + std::to_string(i) + "]", q[i],
            "at most max_seq_len = " + std::to_string(max_seq_len) + " (a step's tokens are in the cache)");
  }
  std::vector<int> sorted = q;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end())
    throw_invalid("q_lens", list_text(q), "distinct values (" + std::to_string(*dup) + " appears more than once)");
  return sorted;
}

}  // namespace

namespace detail {

ExecutorConfig resolve_planning(ExecutorConfig c) {
  validate_spec(c.spec);
  validate_layer_specs(c);
  require(c.max_batch >= 1 && c.max_batch <= kMaxSeqsPerLaunch, "max_batch", c.max_batch,
          "1 .. " + std::to_string(kMaxSeqsPerLaunch) + " (the kernels' grid z)");
  require(c.max_seq_len >= 1, "max_seq_len", c.max_seq_len, ">= 1");
  require(c.v2_threshold >= 1, "v2_threshold", c.v2_threshold, ">= 1");

  if (c.band_edges.empty()) c.band_edges = default_band_edges(c.max_seq_len, c.v2_threshold);
  check_increasing(c.band_edges, "band_edges", "max_seq_len", c.max_seq_len);
  if (c.v2_threshold < c.max_seq_len &&
      !std::binary_search(c.band_edges.begin(), c.band_edges.end(), c.v2_threshold))
    throw_invalid("band_edges", list_text(c.band_edges),
                  "a list containing v2_threshold = " + std::to_string(c.v2_threshold));

  if (c.batch_buckets.empty()) c.batch_buckets = default_batch_buckets(c.max_batch);
  check_increasing(c.batch_buckets, "batch_buckets", "max_batch", c.max_batch);
  c.q_lens = checked_q_lens(c.q_lens, c.max_seq_len);

  if (c.partition_size != 0) validate_partition_size(c.spec, c.partition_size);
  require(c.policy == KernelPolicy::kAuto || c.policy == KernelPolicy::kThreshold ||
              c.policy == KernelPolicy::kMeasured,
          "policy", static_cast<int>(c.policy), "kAuto, kThreshold or kMeasured");
  check_device_model(c.device_model, "the device's, or the host model's");
  require(c.band_select == BandSelect::kHost || c.band_select == BandSelect::kDevice, "band_select",
          static_cast<int>(c.band_select), "kHost or kDevice");
  require(c.measure_replays >= 1 && c.measure_replays <= 1000, "measure_replays", c.measure_replays,
          "1..1000");
  return c;
}

std::size_t cache_bytes_needed(const ExecutorConfig& c, int layer) {
  return static_cast<std::size_t>(c.num_blocks) * layer_spec(c, layer).block_bytes();
}

void check_layer_buffers(const std::vector<LayerBuffers>& layers, const ExecutorConfig& c) {
  require(static_cast<int>(layers.size()) == c.num_layers, "layers.size()", layers.size(),
          "num_layers = " + std::to_string(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers[" + std::to_string(l) + "]";
    require(layers[l].k_cache != nullptr, p + ".k_cache", "null", "a KV cache pointer");
    require(layers[l].v_cache != nullptr, p + ".v_cache", "null", "a KV cache pointer");
    const AttentionSpec& ls = layer_spec(c, l);  // fp8 may differ per layer
    if (ls.fp8_kv()) {
      const std::string allowed = "a pointer to " + std::to_string(ls.kv_scale_count()) +
                                  " fp32 value(s) aligned to 4 bytes (required with kv_dtype " +
                                  to_string(ls.kv_dtype) + ")";
      for (auto [ptr, name] : {std::pair{layers[l].k_scale, ".k_scale"}, std::pair{layers[l].v_scale, ".v_scale"}})
        require(ptr != nullptr && reinterpret_cast<std::uintptr_t>(ptr) % alignof(float) == 0, p + name,
                ptr == nullptr ? std::string("null") : ptr_text(ptr), allowed);
    }
    if (const float* sk = layers[l].sinks; sk != nullptr)
      require(reinterpret_cast<std::uintptr_t>(sk) % alignof(float) == 0, p + ".sinks", ptr_text(sk),
              "null (no sinks) or a pointer aligned to 4 bytes to num_q_heads = " + std::to_string(ls.num_q_heads) +
                  " fp32 raw logits");
  }
  if (c.num_blocks < 1) return;  // reported by the caller's own check, with its message
  const std::size_t esize = dtype_size(c.spec.dtype);  // every layer's (validate_layer_specs)
  const int64_t per_chunk = static_cast<int64_t>(16 / esize);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerBuffers& lb = layers[l];
    const std::string p = "layers[" + std::to_string(l) + "]";
    const AttentionSpec& s = layer_spec(c, l);  // each layer's buffers follow its own spec
    const int64_t q_row = static_cast<int64_t>(s.num_q_heads) * s.head_size;
    const int64_t kv_row = static_cast<int64_t>(s.num_kv_heads) * s.head_size;
    const std::size_t need = cache_bytes_needed(c, l);
    const std::string need_text = "at least num_blocks x block bytes = " + std::to_string(c.num_blocks) + " x " +
                                  std::to_string(s.block_bytes()) + " = " + std::to_string(need) + " bytes";
    // The kernels move rows in 16-byte chunks; executor-owned buffers are contiguous.
    auto stride = [&](int64_t s, const void* ptr, const char* name, int64_t row) {
      if (s == 0) return;
      const std::string param = p + "." + name + "_stride";
      if (ptr == nullptr)
        throw_invalid(param, s, std::string("0 while ") + p + "." + name +
                                    " is null (the executor owns that buffer, and it is contiguous)");
      require(s >= row && s % per_chunk == 0, param, s,
              "0 (contiguous) or a multiple of " + std::to_string(per_chunk) + " elements (16 bytes) that is >= " +
                  std::to_string(row) + " (one row)");
    };
    stride(lb.q_stride, lb.q, "q", q_row);
    stride(lb.out_stride, lb.out, "out", q_row);
    stride(lb.new_key_stride, lb.new_key, "new_key", kv_row);
    stride(lb.new_value_stride, lb.new_value, "new_value", kv_row);
    auto size = [&](std::size_t bytes, const char* name) {
      if (bytes != 0 && bytes < need)
        throw_invalid(p + "." + name, std::to_string(bytes) + " bytes (" + p + "." + name + "_bytes)", need_text);
    };
    size(lb.k_cache_bytes, "k_cache");
    size(lb.v_cache_bytes, "v_cache");
  }
}

ExecutorConfig resolve_config(ExecutorConfig c, const std::function<DeviceModel(const AttentionSpec&)>& device) {
  validate_spec(c.spec);
  require(c.num_layers >= 1, "num_layers", c.num_layers, ">= 1");
  require(static_cast<int>(c.layers.size()) == c.num_layers, "layers.size()", c.layers.size(),
          "num_layers = " + std::to_string(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers[" + std::to_string(l) + "]";
    require(c.layers[l].k_cache != nullptr, p + ".k_cache", "null", "a KV cache pointer");
    require(c.layers[l].v_cache != nullptr, p + ".v_cache", "null", "a KV cache pointer");
  }
  require(c.max_batch >= 1 && c.max_batch <= kMaxSeqsPerLaunch, "max_batch", c.max_batch,
          "1 .. " + std::to_string(kMaxSeqsPerLaunch) + " (the kernels' grid z)");
  require(c.max_seq_len >= 1, "max_seq_len", c.max_seq_len, ">= 1");
  require(c.num_blocks >= 1, "num_blocks", c.num_blocks, ">= 1");
  validate_layer_specs(c);  // before the caches are sized by each layer's spec: a bad spec is the cause
  check_layer_buffers(c.layers, c);
  const int need_blocks = (c.max_seq_len + c.spec.block_size - 1) / c.spec.block_size;
  if (c.max_blocks_per_seq == 0) c.max_blocks_per_seq = need_blocks;
  require(c.max_blocks_per_seq >= need_blocks, "max_blocks_per_seq", c.max_blocks_per_seq,
          "0 (auto) or >= ceil(max_seq_len / block_size) = " + std::to_string(need_blocks));
  c = resolve_planning(std::move(c));
  // Layer group 0's (layer 0's spec); LayerGroups resolves the other groups' models.
  c.device_model = fill_device_model(c.device_model, layer_spec(c, 0), device, "");

  for (int l = 0; l < c.num_layers && !c.alibi_slopes.empty(); ++l) {
    const int heads = layer_spec(c, l).num_q_heads;
    const std::string whose = c.layer_specs.empty() ? "" : " of every layer (layer_specs[" + std::to_string(l) + "])";
    require(static_cast<int>(c.alibi_slopes.size()) == heads, "alibi_slopes.size()", c.alibi_slopes.size(),
            "0 (no ALiBi) or num_q_heads" + whose + " = " + std::to_string(heads));
  }
  require(c.capture == CapturePolicy::kLazy || c.capture == CapturePolicy::kUpFront, "capture",
          static_cast<int>(c.capture), "kUpFront or kLazy");
  require(c.validation == ValidationLevel::kCheap || c.validation == ValidationLevel::kFull,
          "validation", static_cast<int>(c.validation), "kCheap or kFull");
  return c;
}

}  // namespace detail

}  // namespace decodegraph
