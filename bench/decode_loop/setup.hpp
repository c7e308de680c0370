// What the options mean once the backend is known: the backend's defaults (one table row per
// backend), the preset with its overrides, the segments, the sizes of the run and the planning config.
// Everything after this reads a Setup, never the raw command line.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "options.hpp"

namespace dgloop {

/// One --start-lens entry: start lengths for the batch.
struct Segment {
  std::string label;
  std::vector<int> start;
};

/// "N" or "MIN:MAX" entries, comma-separated; MIN:MAX spreads the start lengths evenly over the batch.
std::vector<Segment> parse_segments(const std::string& text, int batch);

/// One layer's sizes, from its own spec.
/// A step of n query tokens per sequence uses batch x n rows of q, out and new K/V (row s * n + j).
struct LayerSizes {
  std::size_t cache_elems = 0;   // its K (or V) cache
  std::size_t kv_esize = 0;      // bytes of one element of its KV cache (1 for fp8)
  std::size_t qo_row = 0;        // one row of q (or out): q heads x head size
  std::size_t kv_row = 0;        // one row of new K (or V): kv heads x head size
  std::size_t qo_elems = 0;      // its q (or out) buffer: batch x the largest n rows
  std::size_t kv_row_elems = 0;  // its new K (or V) buffer: batch x the largest n rows
  /// Elements of a step of `rows` = batch x n rows.
  std::size_t qo_step(std::size_t rows) const { return rows * qo_row; }
  std::size_t kv_step(std::size_t rows) const { return rows * kv_row; }
};

/// Sizes every part of the run shares.
struct Geometry {
  int num_blocks = 0;  // blocks per layer's cache: enough for the segment that needs the most
  int width = 0;       // block-table row width
  std::size_t esize = 0;          // bytes of one element of the dtype (q, out, new K / V; every layer's)
  std::vector<LayerSizes> layer;  // [layers]
  std::size_t max_qo_elems = 0;   // the widest layer's q (or out)
  std::size_t cache_bytes_all = 0;  // every layer's K (or V) cache together
};

struct Setup {
  Options opt;  // with the defaults filled in
  dg::BackendKind backend = dg::BackendKind::kHost;
  bool gpu = false;
  dg::AttentionSpec spec;  // the preset's, with the shape options applied; layer 0's
  /// [layers]: each layer's spec (all `spec` unless the preset's layers differ); ExecutorConfig's
  /// layer_specs where they differ.
  std::vector<dg::AttentionSpec> layer_specs;
  std::vector<Segment> segments;
  std::vector<std::string> defaults_used;  // "--flag value" for each option left out
  dg::ExecutorConfig cfg;                  // what planning reads; the run adds its caches and layers
  std::string model_from;                  // where the device model's numbers come from, for the output
  Geometry geo;
};

/// Resolves the command line; throws UsageError (or dg::Error for a bad shape).
Setup resolve(Options opt);

/// The verify loop's line of the run's header and of --plan-only: the q_lens and what a step does.
std::string verify_loop_line(const std::vector<int>& q_lens);

/// Where the device model's numbers came from, for the output.
std::string model_source(const std::string& option, bool gpu);

}  // namespace dgloop
