// Planning: defaults for bands and buckets, the automatic partition size, configuration checks and
// the per-bucket plans. Everything shape-dependent is decided here, on the host, so that running a
// bucket only replays launches.
#include "executor/plan.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"

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

// Rule: a "wave" is one thread block per SM, and pass 1 launches batch * kv_heads * ceil(band_hi / P)
// blocks. P is the largest multiple of block_size, at least 256, for which that count is still
// >= num_sms (so partitions stay as long as possible while every SM has work). If even P = 256 gives
// less than a wave (small batch x heads, short band), P = 256: shorter partitions only add merge cost
// and partials traffic. If one partition per (sequence, head) already fills a wave, P covers band_hi
// (rounded up to block_size, and at least 256).
int auto_partition_size(const AttentionSpec& spec, int batch, int band_hi, int num_sms) {
  require(spec.block_size > 0, "spec.block_size", spec.block_size, "a positive value");
  require(batch > 0, "batch", batch, ">= 1");
  require(band_hi > 0, "band_hi", band_hi, ">= 1");
  require(num_sms > 0, "num_sms", num_sms, ">= 1");
  const long long bs = spec.block_size;
  const long long min_p = (256 + bs - 1) / bs * bs;
  const long long per_part = static_cast<long long>(batch) * std::max(spec.num_kv_heads, 1);
  const long long need = (num_sms + per_part - 1) / per_part;  // partitions per (seq, head)
  const long long whole = std::max(min_p, (band_hi + bs - 1) / bs * bs);
  if (need <= 1) return static_cast<int>(whole);
  // ceil(L / P) >= need  <=>  P < L / (need - 1)  <=>  P <= ceil(L / (need - 1)) - 1
  const long long limit = (band_hi + (need - 1) - 1) / (need - 1) - 1;
  const long long p = limit / bs * bs;
  return static_cast<int>(std::clamp(p, min_p, whole));
}

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

}  // namespace

namespace detail {

ExecutorConfig resolve_config(ExecutorConfig c, int device_sms) {
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
  const int need_blocks = (c.max_seq_len + c.spec.block_size - 1) / c.spec.block_size;
  if (c.max_blocks_per_seq == 0) c.max_blocks_per_seq = need_blocks;
  require(c.max_blocks_per_seq >= need_blocks, "max_blocks_per_seq", c.max_blocks_per_seq,
          "0 (auto) or >= ceil(max_seq_len / block_size) = " + std::to_string(need_blocks));
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
  require(c.num_sms >= 0, "num_sms", c.num_sms, "0 (query the device) or >= 1");
  if (c.num_sms == 0) c.num_sms = device_sms;

  require(c.alibi_slopes.empty() || static_cast<int>(c.alibi_slopes.size()) == c.spec.num_q_heads,
          "alibi_slopes.size()", c.alibi_slopes.size(),
          "0 (no ALiBi) or num_q_heads = " + std::to_string(c.spec.num_q_heads));
  require(c.capture == CapturePolicy::kLazy || c.capture == CapturePolicy::kUpFront, "capture",
          static_cast<int>(c.capture), "kUpFront or kLazy");
  require(c.validation == ValidationLevel::kCheap || c.validation == ValidationLevel::kFull,
          "validation", static_cast<int>(c.validation), "kCheap or kFull");
  return c;
}

std::vector<BucketPlan> make_plans(const ExecutorConfig& c) {
  std::vector<BucketPlan> plans;
  plans.reserve(c.batch_buckets.size() * c.band_edges.size());
  for (int batch : c.batch_buckets) {
    for (int band = 0; band < static_cast<int>(c.band_edges.size()); ++band) {
      BucketPlan p;
      p.batch = batch;
      p.band = band;
      p.band_lo = band == 0 ? 0 : c.band_edges[band - 1];
      p.band_hi = c.band_edges[band];
      p.kernel = p.band_hi <= c.v2_threshold ? KernelKind::kV1 : KernelKind::kV2;
      // Grids as the kernels map work (docs/architecture.md): x = partition, y = KV head (the
      // launcher may split large GQA groups into head chunks along y), z = sequence.
      p.grid_y = c.spec.num_kv_heads;
      p.grid_z = batch;
      if (p.kernel == KernelKind::kV1) {
        p.grid_x = 1;
      } else {
        p.partition_size = c.partition_size != 0
                               ? c.partition_size
                               : auto_partition_size(c.spec, batch, p.band_hi, c.num_sms);
        p.max_partitions = num_partitions(p.band_hi, p.partition_size);
        p.grid_x = p.max_partitions;
        p.merge_grid_x = c.spec.num_q_heads;  // one merge block per (query head, sequence)
        p.merge_grid_y = batch;
        p.workspace_bytes = v2_workspace_size(c.spec, batch, p.band_hi, p.partition_size);
      }
      plans.push_back(p);
    }
  }
  return plans;
}

}  // namespace detail

std::string format_plan_table(const std::vector<BucketPlan>& plans) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%6s %5s %15s %6s %6s %6s %18s %12s %12s\n", "batch", "band",
                "lengths", "kernel", "P", "parts", "grid (x,y,z)", "merge (x,y)", "workspace");
  os << line;
  for (const BucketPlan& p : plans) {
    char lengths[40], grid[40], merge[40];
    std::snprintf(lengths, sizeof lengths, "(%d,%d]", p.band_lo, p.band_hi);
    std::snprintf(grid, sizeof grid, "%d,%d,%d", p.grid_x, p.grid_y, p.grid_z);
    if (p.kernel == KernelKind::kV2)
      std::snprintf(merge, sizeof merge, "%d,%d", p.merge_grid_x, p.merge_grid_y);
    else
      std::snprintf(merge, sizeof merge, "-");
    std::snprintf(line, sizeof line, "%6d %5d %15s %6s %6d %6d %18s %12s %12zu\n", p.batch, p.band,
                  lengths, to_string(p.kernel), p.partition_size, p.max_partitions, grid, merge,
                  p.workspace_bytes);
    os << line;
  }
  return os.str();
}

}  // namespace decodegraph
