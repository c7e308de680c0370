// Planning: defaults for bands and buckets, configuration checks, the device model, the kernel and
// partition choice per bucket under a KernelPolicy, and which buckets share a graph. Everything
// shape-dependent is decided here, on the host, so that running a bucket only replays launches.
// docs/planning.md explains the rules; the numbers in its examples come from this file.
#include "executor/plan.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "kernels/occupancy.hpp"

namespace decodegraph {

const char* to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kCuda: return "cuda";
    case BackendKind::kHost: return "host";
  }
  return "unknown";
}

const char* to_string(CapturePolicy policy) {
  switch (policy) {
    case CapturePolicy::kUpFront: return "up_front";
    case CapturePolicy::kLazy: return "lazy";
  }
  return "unknown";
}

const char* to_string(KernelPolicy policy) {
  switch (policy) {
    case KernelPolicy::kAuto: return "auto";
    case KernelPolicy::kThreshold: return "threshold";
    case KernelPolicy::kMeasured: return "measured";
  }
  return "unknown";
}

const char* to_string(BandSelect mode) {
  switch (mode) {
    case BandSelect::kHost: return "host";
    case BandSelect::kDevice: return "device";
  }
  return "unknown";
}

KernelPolicy parse_kernel_policy(const std::string& name) {
  if (name == "auto") return KernelPolicy::kAuto;
  if (name == "threshold") return KernelPolicy::kThreshold;
  if (name == "measured") return KernelPolicy::kMeasured;
  throw_invalid("policy", '"' + name + '"', "auto, threshold, measured");
}

const char* to_string(PlanReason reason) {
  switch (reason) {
    case PlanReason::kFillsGpu: return "fills_gpu";
    case PlanReason::kUnderfills: return "underfills";
    case PlanReason::kAboveThreshold: return "above_threshold";
    case PlanReason::kThresholdRule: return "threshold_rule";
    case PlanReason::kMeasuredFastest: return "measured_fastest";
    case PlanReason::kNotMeasured: return "not_measured";
  }
  return "unknown";
}

std::vector<int> default_band_edges(int max_seq_len, int v2_threshold) {
  std::vector<int> edges;
  for (long long e = 512; e < max_seq_len; e *= 2) edges.push_back(static_cast<int>(e));
  if (v2_threshold > 0 && v2_threshold < max_seq_len) edges.push_back(v2_threshold);
  if (max_seq_len > 0) edges.push_back(max_seq_len);
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  return edges;
}

std::vector<int> default_batch_buckets(int max_batch) {
  std::vector<int> b;
  for (int v : {1, 2, 4, 8})
    if (v < max_batch) b.push_back(v);
  for (int v = 16; v <= 256 && v < max_batch; v += 8) b.push_back(v);
  for (int v = 272; v < max_batch; v += 16) b.push_back(v);
  if (max_batch > 0) b.push_back(max_batch);
  return b;
}

// ---------------------------------------------------------------- partition size

namespace {

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }
long long round_up(long long a, long long b) { return ceil_div(a, b) * b; }

/// The minimum partition: ~256 tokens, a whole number of cache blocks. Shorter partitions add merge
/// work and partials traffic faster than they add parallelism.
long long min_partition(int block_size) { return round_up(256, block_size); }

}  // namespace

// P(k) = max(min, round_up(ceil(L / k), block_size)) is the even split of L into k partitions,
// rounded up to whole cache blocks: every partition but the last holds P tokens, at most one block
// more than the even share, and the last takes what is left (the seed's rule, the largest P that
// still gives enough partitions, left a sliver instead: 8176 + 8176 + 32). Rounding up can lose a
// partition (L = 32768, k = 83: P = 400 gives 82), so k grows from min_parts until P(k) gives at
// least min_parts; P(k) only shrinks as k grows, so this is the longest balanced P that does. At the
// minimum partition the search stops: that is the most partitions the minimum allows.
int balanced_partition_size(int design_len, int min_parts, int block_size) {
  require(design_len >= 1, "design_len", design_len, ">= 1");
  require(block_size >= 1, "block_size", block_size, ">= 1");
  const long long len = design_len;
  const long long min_p = min_partition(block_size);
  const long long want = std::max(min_parts, 1);
  for (long long k = want;; ++k) {
    const long long p = std::max(min_p, round_up(ceil_div(len, k), block_size));
    if (ceil_div(len, p) >= want || p == min_p) return static_cast<int>(p);
  }
}

// ---------------------------------------------------------------- plan helpers

namespace {

/// The length a band's partitions are sized for: its lower edge. The first band's lower edge is 0,
/// which asks for no partitions at all; half its upper edge is where its lengths double, the same
/// ratio every other default band spans, so its longer half (which sets the step's time) is split.
int design_length(int band_lo, int band_hi) { return band_lo > 0 ? band_lo : std::max(1, band_hi / 2); }

/// Pass-1 blocks per partition index: one per (sequence, KV head, head chunk), as the launcher maps
/// grid y (kernels::pass1_head_chunks).
long long blocks_per_partition(const AttentionSpec& spec, int batch) {
  return static_cast<long long>(batch) * spec.num_kv_heads * kernels::pass1_head_chunks(spec);
}

/// kAuto's partition size for a V2 bucket (or the caller's fixed one).
int auto_v2_partition(const BucketPlan& p, const ExecutorConfig& c) {
  if (c.partition_size != 0) return c.partition_size;
  const long long need = ceil_div(c.device_model.target_blocks(), blocks_per_partition(c.spec, p.batch));
  return balanced_partition_size(p.design_len, static_cast<int>(std::min<long long>(need, 1 << 30)),
                                 c.spec.block_size);
}

}  // namespace

// ---------------------------------------------------------------- configuration checks

namespace {

std::string list_text(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

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

constexpr int kMaxSms = 65536;
constexpr int kMaxBlocksPerSm = 64;

void check_device_model(const DeviceModel& d, const char* source) {
  const std::string what = std::string("0 (") + source + ") or ";
  require(d.num_sms >= 0 && d.num_sms <= kMaxSms, "device_model.num_sms", d.num_sms,
          what + "1.." + std::to_string(kMaxSms));
  require(d.blocks_per_sm >= 0 && d.blocks_per_sm <= kMaxBlocksPerSm, "device_model.blocks_per_sm",
          d.blocks_per_sm, what + "1.." + std::to_string(kMaxBlocksPerSm));
}

}  // namespace

namespace detail {

ExecutorConfig resolve_planning(ExecutorConfig c) {
  validate_spec(c.spec);
  require(c.max_batch >= 1, "max_batch", c.max_batch, ">= 1");
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

std::size_t cache_bytes_needed(const ExecutorConfig& c) {
  return static_cast<std::size_t>(c.num_blocks) * c.spec.block_elems() * dtype_size(c.spec.dtype);
}

void check_layer_buffers(const std::vector<LayerBuffers>& layers, const ExecutorConfig& c) {
  require(static_cast<int>(layers.size()) == c.num_layers, "layers.size()", layers.size(),
          "num_layers = " + std::to_string(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers[" + std::to_string(l) + "]";
    require(layers[l].k_cache != nullptr, p + ".k_cache", "null", "a KV cache pointer");
    require(layers[l].v_cache != nullptr, p + ".v_cache", "null", "a KV cache pointer");
  }
  if (c.num_blocks < 1) return;  // reported by the caller's own check, with its message
  const std::size_t esize = dtype_size(c.spec.dtype);
  const int64_t per_chunk = static_cast<int64_t>(16 / esize);
  const int64_t q_row = static_cast<int64_t>(c.spec.num_q_heads) * c.spec.head_size;
  const int64_t kv_row = static_cast<int64_t>(c.spec.num_kv_heads) * c.spec.head_size;
  const std::size_t need = cache_bytes_needed(c);
  const std::string need_text = "at least num_blocks x block bytes = " + std::to_string(c.num_blocks) + " x " +
                                std::to_string(c.spec.block_elems() * esize) + " = " + std::to_string(need) +
                                " bytes";
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerBuffers& lb = layers[l];
    const std::string p = "layers[" + std::to_string(l) + "]";
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
  require(c.max_batch >= 1, "max_batch", c.max_batch, ">= 1");
  require(c.max_seq_len >= 1, "max_seq_len", c.max_seq_len, ">= 1");
  require(c.num_blocks >= 1, "num_blocks", c.num_blocks, ">= 1");
  check_layer_buffers(c.layers, c);
  const int need_blocks = (c.max_seq_len + c.spec.block_size - 1) / c.spec.block_size;
  if (c.max_blocks_per_seq == 0) c.max_blocks_per_seq = need_blocks;
  require(c.max_blocks_per_seq >= need_blocks, "max_blocks_per_seq", c.max_blocks_per_seq,
          "0 (auto) or >= ceil(max_seq_len / block_size) = " + std::to_string(need_blocks));
  c = resolve_planning(std::move(c));

  if (c.device_model.num_sms == 0 || c.device_model.blocks_per_sm == 0) {
    const DeviceModel d = device(c.spec);
    if (c.device_model.num_sms == 0) c.device_model.num_sms = d.num_sms;
    if (c.device_model.blocks_per_sm == 0) c.device_model.blocks_per_sm = d.blocks_per_sm;
    // What the device reported must make sense too (a pass-1 block that does not fit reports 0).
    require(c.device_model.num_sms >= 1, "device_model.num_sms", c.device_model.num_sms,
            ">= 1 (as queried from the device)");
    require(c.device_model.blocks_per_sm >= 1, "device_model.blocks_per_sm", c.device_model.blocks_per_sm,
            ">= 1 (as queried from the device: the pass-1 kernel does not fit on an SM)");
  }

  require(c.alibi_slopes.empty() || static_cast<int>(c.alibi_slopes.size()) == c.spec.num_q_heads,
          "alibi_slopes.size()", c.alibi_slopes.size(),
          "0 (no ALiBi) or num_q_heads = " + std::to_string(c.spec.num_q_heads));
  require(c.capture == CapturePolicy::kLazy || c.capture == CapturePolicy::kUpFront, "capture",
          static_cast<int>(c.capture), "kUpFront or kLazy");
  require(c.validation == ValidationLevel::kCheap || c.validation == ValidationLevel::kFull,
          "validation", static_cast<int>(c.validation), "kCheap or kFull");
  return c;
}

// ---------------------------------------------------------------- plans

void set_launch(BucketPlan& p, const ExecutorConfig& c, KernelKind kernel, int partition_size) {
  const long long per_part = blocks_per_partition(c.spec, p.batch);
  p.kernel = kernel;
  p.grid_y = c.spec.num_kv_heads * kernels::pass1_head_chunks(c.spec);
  p.grid_z = p.batch;
  if (kernel == KernelKind::kV1) {
    // NOTE(graph): V1 launches are sized for the largest V1 band edge, not their own band_hi, so a
    // batch bucket's V1 launches are identical across bands and share a graph. The grid does not
    // depend on it; lengths are read from device memory and clamped to it, and max_blocks_per_seq
    // covers it (it is <= max_seq_len).
    p.launch_len = std::min(c.v2_threshold, c.max_seq_len);
    p.partition_size = 0;
    p.max_partitions = 1;
    p.merge_grid_x = p.merge_grid_y = 0;
    p.workspace_bytes = 0;
  } else {
    p.launch_len = p.band_hi;
    p.partition_size = partition_size;
    p.max_partitions = num_partitions(p.band_hi, partition_size);
    p.merge_grid_x = c.spec.num_q_heads;  // one merge block per (query head, sequence)
    p.merge_grid_y = p.batch;
    p.workspace_bytes = v2_workspace_size(c.spec, p.batch, p.band_hi, partition_size);
  }
  p.grid_x = p.max_partitions;
  const long long live_parts = kernel == KernelKind::kV1 ? 1 : num_partitions(p.design_len, partition_size);
  p.blocks = static_cast<int>(p.grid_x * per_part);
  p.target_blocks = c.device_model.target_blocks();
  p.live_blocks_at_band_lo = static_cast<int>(live_parts * per_part);
  p.waves = static_cast<double>(p.blocks) / std::max(1, p.target_blocks);
}

std::vector<PlanCandidate> measure_candidates(const BucketPlan& p, const ExecutorConfig& c) {
  std::vector<PlanCandidate> out;
  if (p.band_hi <= c.v2_threshold) out.push_back({KernelKind::kV1, 0, -1});
  const int bs = c.spec.block_size;
  const int auto_p = auto_v2_partition(p, c);
  std::vector<int> sizes = {auto_p};
  if (c.partition_size == 0) {
    const long long min_p = min_partition(bs);
    const long long longest = round_up(p.band_hi, bs);
    for (long long q : {static_cast<long long>(auto_p) / 2 / bs * bs, 2LL * auto_p})
      if (q >= min_p && q < longest && q != auto_p) sizes.push_back(static_cast<int>(q));
  }
  for (int s : sizes) out.push_back({KernelKind::kV2, s, -1});
  return out;
}

LaunchKey launch_key(const BucketPlan& p) {
  return {static_cast<int>(p.kernel), p.batch,    p.launch_len, p.partition_size,
          p.max_partitions,           p.grid_x,   p.grid_y,     p.workspace_bytes};
}

std::vector<BucketPlan> make_plans(const ExecutorConfig& c) {
  std::vector<BucketPlan> plans;
  plans.reserve(c.batch_buckets.size() * c.band_edges.size());
  const long long target = c.device_model.target_blocks();
  for (int batch : c.batch_buckets) {
    for (int band = 0; band < static_cast<int>(c.band_edges.size()); ++band) {
      BucketPlan p;
      p.batch = batch;
      p.band = band;
      p.band_lo = band == 0 ? 0 : c.band_edges[band - 1];
      p.band_hi = c.band_edges[band];
      p.design_len = design_length(p.band_lo, p.band_hi);
      KernelKind kernel;
      if (p.band_hi > c.v2_threshold) {
        kernel = KernelKind::kV2;
        p.reason = PlanReason::kAboveThreshold;
      } else if (c.policy == KernelPolicy::kThreshold) {
        kernel = KernelKind::kV1;
        p.reason = PlanReason::kThresholdRule;
      } else {
        const bool fills = blocks_per_partition(c.spec, batch) >= target;
        kernel = fills ? KernelKind::kV1 : KernelKind::kV2;
        p.reason = fills ? PlanReason::kFillsGpu : PlanReason::kUnderfills;
      }
      set_launch(p, c, kernel, kernel == KernelKind::kV2 ? auto_v2_partition(p, c) : 0);
      if (c.policy == KernelPolicy::kMeasured) {
        p.candidates = measure_candidates(p, c);
        p.reason = PlanReason::kNotMeasured;  // kAuto's choice until the bucket is measured
      }
      plans.push_back(std::move(p));
    }
  }
  if (c.policy != KernelPolicy::kMeasured) {
    std::map<LaunchKey, int> ids;
    for (BucketPlan& p : plans) p.graph_id = ids.emplace(launch_key(p), static_cast<int>(ids.size())).first->second;
  }
  return plans;
}

}  // namespace detail

DeviceModel host_device_model(const AttentionSpec& spec) {
  DeviceModel d;
  d.num_sms = 132;  // H200 SXM
  d.blocks_per_sm = kernels::blocks_per_sm(kernels::pass1_resources(spec));
  return d;
}

std::vector<BucketPlan> plan_buckets(const ExecutorConfig& config) {
  ExecutorConfig c = detail::resolve_planning(config);
  const DeviceModel host = host_device_model(c.spec);
  if (c.device_model.num_sms == 0) c.device_model.num_sms = host.num_sms;
  if (c.device_model.blocks_per_sm == 0) c.device_model.blocks_per_sm = host.blocks_per_sm;
  return detail::make_plans(c);
}

int auto_partition_size(const AttentionSpec& spec, int batch, int band_hi, int num_sms) {
  validate_spec(spec);
  require(batch >= 1, "batch", batch, ">= 1");
  require(band_hi >= 1, "band_hi", band_hi, ">= 1");
  require(num_sms >= 1, "num_sms", num_sms, ">= 1");
  const long long target = static_cast<long long>(num_sms) * host_device_model(spec).blocks_per_sm;
  const long long need = ceil_div(target, blocks_per_partition(spec, batch));
  return balanced_partition_size(std::max(1, band_hi / 2), static_cast<int>(need), spec.block_size);
}

// ---------------------------------------------------------------- output

std::string describe_reason(const BucketPlan& p) {
  const int per_part = p.grid_y * p.grid_z;
  char b[256];
  switch (p.reason) {
    case PlanReason::kFillsGpu:
      std::snprintf(b, sizeof b, "V1 fills the GPU: %d blocks >= target %d", per_part, p.target_blocks);
      break;
    case PlanReason::kUnderfills:
      std::snprintf(b, sizeof b, "V1 fills %d of %d slots; V2: %d blocks at %d tokens, %d at %d", per_part,
                    p.target_blocks, p.live_blocks_at_band_lo, p.design_len, p.blocks, p.band_hi);
      break;
    case PlanReason::kAboveThreshold:
      std::snprintf(b, sizeof b, "above the V1/V2 threshold: always V2");
      break;
    case PlanReason::kThresholdRule:
      std::snprintf(b, sizeof b, "threshold rule: V1 up to the threshold");
      break;
    case PlanReason::kNotMeasured:
      std::snprintf(b, sizeof b, "not measured yet: kAuto's choice for now");
      break;
    case PlanReason::kMeasuredFastest: {
      std::string s = "measured fastest of";
      for (const PlanCandidate& c : p.candidates) {
        char one[64];
        if (c.kernel == KernelKind::kV1)
          std::snprintf(one, sizeof one, " v1 %.1f us", c.us);
        else
          std::snprintf(one, sizeof one, " v2/P%d %.1f us", c.partition_size, c.us);
        s += one;
        if (&c != &p.candidates.back()) s += ",";
      }
      return s;
    }
    default: std::snprintf(b, sizeof b, "unknown");
  }
  return b;
}

std::string format_plan_table(const std::vector<BucketPlan>& plans) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%6s %5s %15s %6s %6s %6s %16s %10s %10s %7s %7s %8s %6s %6s  %s\n", "batch",
                "band", "lengths", "kernel", "P", "parts", "grid (x,y,z)", "merge", "workspace", "blocks", "target",
                "live@lo", "waves", "graph", "why");
  os << line;
  for (const BucketPlan& p : plans) {
    char lengths[40], grid[40], merge[40], part[16], graph[16];
    std::snprintf(lengths, sizeof lengths, "(%d,%d]", p.band_lo, p.band_hi);
    std::snprintf(grid, sizeof grid, "%d,%d,%d", p.grid_x, p.grid_y, p.grid_z);
    const bool v2 = p.kernel == KernelKind::kV2;
    if (v2) {
      std::snprintf(merge, sizeof merge, "%d,%d", p.merge_grid_x, p.merge_grid_y);
      std::snprintf(part, sizeof part, "%d", p.partition_size);
    } else {
      std::snprintf(merge, sizeof merge, "-");
      std::snprintf(part, sizeof part, "-");
    }
    if (p.graph_id >= 0)
      std::snprintf(graph, sizeof graph, "%d", p.graph_id);
    else
      std::snprintf(graph, sizeof graph, "-");
    std::snprintf(line, sizeof line, "%6d %5d %15s %6s %6s %6d %16s %10s %10zu %7d %7d %8d %6.2f %6s  %s\n", p.batch,
                  p.band, lengths, to_string(p.kernel), part, p.max_partitions, grid, merge, p.workspace_bytes,
                  p.blocks, p.target_blocks, p.live_blocks_at_band_lo, p.waves, graph, describe_reason(p).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace decodegraph
