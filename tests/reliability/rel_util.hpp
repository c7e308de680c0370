// Shared rig for the reliability tests: a small host-backend executor with its own paged KV caches,
// random step inputs (distinct blocks per sequence, so KV appends never collide), snapshots of
// everything a rejected call must leave untouched, and the float64 check of a finished step.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/executor.hpp"
#include "test_util.hpp"

namespace dgrel {

using namespace decodegraph;

/// |out - ref| <= atol + rtol*|ref|. fp32: accumulation-order error only. fp16/bf16: the output is
/// rounded once to the dtype (2^-11 / 2^-8 relative) on top of fp32 accumulation.
struct Tol {
  double atol, rtol;
};
inline Tol tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return {2e-5, 1e-4};
    case DType::kFloat16: return {2e-3, 2e-3};
    case DType::kBFloat16: return {1e-2, 1e-2};
  }
  return {0, 0};
}

/// Index of element (block, offset, head, d) in the K (is_key) or V cache of either layout.
inline std::size_t cache_index(const AttentionSpec& s, bool is_key, std::size_t block, int off, int h,
                               int d) {
  const std::size_t kvh = s.num_kv_heads, hs = s.head_size, bs = s.block_size;
  if (s.layout == KVLayout::kNHD) return ((block * bs + off) * kvh + h) * hs + d;
  if (is_key) {
    const std::size_t x = 16 / dtype_size(s.dtype);
    return (((block * kvh + h) * (hs / x) + d / x) * bs + off) * x + d % x;
  }
  return ((block * kvh + h) * hs + d) * bs + off;
}

/// One step's host inputs.
struct Inputs {
  int num_seqs = 0;
  int stride = 0;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> block_tables;
  std::vector<int64_t> slots;
  StepInputs view() const {
    StepInputs in;
    in.num_seqs = num_seqs;
    in.seq_lens = seq_lens.data();
    in.block_tables = block_tables.data();
    in.block_table_stride = stride;
    in.slot_mapping = slots.data();
    return in;
  }
};

struct Rig {
  ExecutorConfig cfg;
  std::vector<std::vector<std::uint64_t>> k_caches, v_caches;  // 8-byte words: aligned storage
  std::mt19937_64 rng{1234};

  /// A small config: 4 q heads over 2 KV heads, head 64, block 16; bands 256 | 512 (V1) | 1024 (V2).
  explicit Rig(DType dtype = DType::kFloat32, KVLayout layout = KVLayout::kVLLM, int num_layers = 2,
               int max_batch = 8, int max_seq_len = 1024, uint64_t seed = 1234)
      : rng(seed) {
    cfg.spec.num_q_heads = 4;
    cfg.spec.num_kv_heads = 2;
    cfg.spec.head_size = 64;
    cfg.spec.block_size = 16;
    cfg.spec.dtype = dtype;
    cfg.spec.layout = layout;
    cfg.num_layers = num_layers;
    cfg.max_batch = max_batch;
    cfg.max_seq_len = max_seq_len;
    cfg.max_blocks_per_seq = (max_seq_len + cfg.spec.block_size - 1) / cfg.spec.block_size;
    cfg.num_blocks = max_batch * cfg.max_blocks_per_seq;
    cfg.v2_threshold = max_seq_len / 2;
    cfg.band_edges = {max_seq_len / 4, max_seq_len / 2, max_seq_len};
    cfg.batch_buckets = {};
    cfg.partition_size = 128;
    // Both kernels: V1 up to the threshold, V2 above. kAuto would run V2 everywhere at these batches
    // on the H200 model (at most 8 x 2 blocks per partition, against 660 resident slots).
    cfg.policy = KernelPolicy::kThreshold;
    cfg.backend = BackendKind::kHost;
    cfg.capture = CapturePolicy::kLazy;
    cfg.validation = ValidationLevel::kFull;
    cfg.log_level = "off";
    const std::size_t words = cache_bytes() / 8 + 2;
    for (int l = 0; l < num_layers; ++l) {
      k_caches.emplace_back(words);
      v_caches.emplace_back(words);
      dgtest::fill_uniform(dtype, k_caches.back().data(), cache_elems(), rng);
      dgtest::fill_uniform(dtype, v_caches.back().data(), cache_elems(), rng);
    }
    bind_layers();
  }
  std::size_t cache_elems() const {
    return static_cast<std::size_t>(cfg.num_blocks) * cfg.spec.block_elems();
  }
  std::size_t cache_bytes() const { return cache_elems() * dtype_size(cfg.spec.dtype); }
  std::size_t row_elems() const {
    return static_cast<std::size_t>(cfg.spec.num_q_heads) * cfg.spec.head_size;
  }
  std::size_t kv_row_elems() const {
    return static_cast<std::size_t>(cfg.spec.num_kv_heads) * cfg.spec.head_size;
  }
  void bind_layers() {
    cfg.layers.assign(cfg.num_layers, LayerBuffers{});
    for (int l = 0; l < cfg.num_layers; ++l) {
      cfg.layers[l].k_cache = k_caches[l].data();
      cfg.layers[l].v_cache = v_caches[l].data();
      cfg.layers[l].k_cache_bytes = cfg.layers[l].v_cache_bytes = cache_bytes();
    }
  }

  /// Random inputs: lengths in [min_len, max_len]; each sequence gets distinct blocks (a random
  /// permutation), the unused table tail random valid ids; the slot is the last token's position.
  Inputs random_inputs(int num_seqs, int min_len, int max_len) {
    Inputs in;
    in.num_seqs = num_seqs;
    in.stride = cfg.max_blocks_per_seq;
    std::vector<int32_t> perm(cfg.num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::uniform_int_distribution<int> len_d(min_len, max_len), blk_d(0, cfg.num_blocks - 1);
    std::size_t next = 0;
    const int bs = cfg.spec.block_size;
    for (int i = 0; i < num_seqs; ++i) {
      const int len = len_d(rng);
      in.seq_lens.push_back(len);
      const int need = (len + bs - 1) / bs;
      for (int j = 0; j < in.stride; ++j)
        in.block_tables.push_back(j < need ? perm.at(next++) : blk_d(rng));
      const int32_t last_block = in.block_tables[static_cast<std::size_t>(i) * in.stride + (len - 1) / bs];
      in.slots.push_back(static_cast<int64_t>(last_block) * bs + (len - 1) % bs);
    }
    return in;
  }

  /// Random q and new K/V for every layer (executor-owned buffers), never all zeros.
  void fill_step_buffers(Executor& ex) {
    const DType dt = cfg.spec.dtype;
    for (int l = 0; l < cfg.num_layers; ++l) {
      dgtest::fill_uniform(dt, ex.query(l), cfg.max_batch * row_elems(), rng);
      dgtest::fill_uniform(dt, ex.new_key(l), cfg.max_batch * kv_row_elems(), rng);
      dgtest::fill_uniform(dt, ex.new_value(l), cfg.max_batch * kv_row_elems(), rng);
    }
  }

  /// Host views of the step buffers the check reads (per layer).
  struct Views {
    std::vector<const void*> q, out, new_key, new_value;
  };
  Views host_views(Executor& ex) const {
    Views v;
    for (int l = 0; l < cfg.num_layers; ++l) {
      v.q.push_back(ex.query(l));
      v.out.push_back(ex.output(l));
      v.new_key.push_back(ex.new_key(l));
      v.new_value.push_back(ex.new_value(l));
    }
    return v;
  }

  /// Checks a finished step: each appended K/V sits at its slot, and every layer's output rows match
  /// the float64 reference over the (appended) cache; rows past num_seqs are not looked at.
  ::testing::AssertionResult check_step(Executor& ex, const Inputs& in) {
    return check_step(host_views(ex), in);
  }
  ::testing::AssertionResult check_step(const Views& b, const Inputs& in) {
    const AttentionSpec& s = cfg.spec;
    const DType dt = s.dtype;
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (cfg.append_kv) {
        for (int i = 0; i < in.num_seqs; ++i) {
          const int64_t slot = in.slots[i];
          if (slot < 0) continue;
          const std::size_t blk = static_cast<std::size_t>(slot / s.block_size);
          const int off = static_cast<int>(slot % s.block_size);
          for (int h = 0; h < s.num_kv_heads; ++h)
            for (int d = 0; d < s.head_size; ++d) {
              const std::size_t src = (static_cast<std::size_t>(i) * s.num_kv_heads + h) * s.head_size + d;
              const float k = load_as_float(dt, b.new_key[l], src);
              const float v = load_as_float(dt, b.new_value[l], src);
              const float kc = load_as_float(dt, k_caches[l].data(), cache_index(s, true, blk, off, h, d));
              const float vc = load_as_float(dt, v_caches[l].data(), cache_index(s, false, blk, off, h, d));
              if (k != kc || v != vc)
                return ::testing::AssertionFailure()
                       << "layer " << l << " seq " << i << " slot " << slot << " head " << h << " d " << d
                       << ": appended K/V " << k << "/" << v << " but cache holds " << kc << "/" << vc;
            }
        }
      }
      DecodeArgs a;
      a.spec = s;
      a.num_seqs = in.num_seqs;
      a.max_seq_len = *std::max_element(in.seq_lens.begin(), in.seq_lens.end());
      a.block_table_stride = in.stride;
      a.num_blocks = cfg.num_blocks;
      a.q = b.q[l];
      a.out = const_cast<void*>(b.out[l]);  // validated, not written by the reference
      a.k_cache = k_caches[l].data();
      a.v_cache = v_caches[l].data();
      a.block_tables = in.block_tables.data();
      a.seq_lens = in.seq_lens.data();
      a.alibi_slopes = cfg.alibi_slopes.empty() ? nullptr : cfg.alibi_slopes.data();
      std::vector<double> ref(in.num_seqs * row_elems(), 0.0);
      reference::paged_attention(a, ref.data());
      const Tol t = tolerance(dt);
      auto r = dgtest::check_close(dt, b.out[l], ref.data(), in.num_seqs, s.num_q_heads, s.head_size,
                                   t.atol, t.rtol);
      if (!r) return r << " (layer " << l << ")";
    }
    return ::testing::AssertionSuccess();
  }
};

/// Bytes of every executor-visible buffer a rejected call must leave as they were.
struct Snapshot {
  std::vector<std::vector<unsigned char>> outputs, k, v;
  ExecutorStats stats;
  MemoryReport mem;
  static std::vector<unsigned char> bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    return {b, b + n};
  }
  static Snapshot take(Rig& rig, Executor& ex) {
    Snapshot s;
    const std::size_t out_bytes = rig.cfg.max_batch * rig.row_elems() * dtype_size(rig.cfg.spec.dtype);
    for (int l = 0; l < rig.cfg.num_layers; ++l) {
      s.outputs.push_back(bytes(ex.output(l), out_bytes));
      s.k.push_back(bytes(rig.k_caches[l].data(), rig.cache_bytes()));
      s.v.push_back(bytes(rig.v_caches[l].data(), rig.cache_bytes()));
    }
    s.stats = ex.stats();
    s.mem = ex.memory();
    return s;
  }
};

/// Everything but the rejected-step counter is unchanged (outputs, caches, graphs, replays, memory).
inline ::testing::AssertionResult same_state(const Snapshot& a, const Snapshot& b) {
  for (std::size_t l = 0; l < a.outputs.size(); ++l) {
    if (a.outputs[l] != b.outputs[l]) return ::testing::AssertionFailure() << "output " << l << " changed";
    if (a.k[l] != b.k[l]) return ::testing::AssertionFailure() << "K cache " << l << " changed";
    if (a.v[l] != b.v[l]) return ::testing::AssertionFailure() << "V cache " << l << " changed";
  }
  if (a.stats.steps != b.stats.steps)
    return ::testing::AssertionFailure() << "steps " << a.stats.steps << " -> " << b.stats.steps;
  if (a.stats.total_captures != b.stats.total_captures)
    return ::testing::AssertionFailure() << "total_captures " << a.stats.total_captures << " -> "
                                         << b.stats.total_captures;
  if (a.stats.graphs.size() != b.stats.graphs.size())
    return ::testing::AssertionFailure() << "graphs " << a.stats.graphs.size() << " -> "
                                         << b.stats.graphs.size();
  for (std::size_t i = 0; i < a.stats.graphs.size(); ++i) {
    const GraphStats &x = a.stats.graphs[i], &y = b.stats.graphs[i];
    if (x.captures != y.captures || x.replays != y.replays || x.batch != y.batch || x.band != y.band)
      return ::testing::AssertionFailure() << "graph stats of bucket (" << x.batch << ", band " << x.band
                                           << ") changed";
  }
  if (a.mem.static_buffers != b.mem.static_buffers || a.mem.workspace != b.mem.workspace ||
      a.mem.graphs != b.mem.graphs)
    return ::testing::AssertionFailure() << "memory report changed: " << a.mem.total() << " -> "
                                         << b.mem.total();
  return ::testing::AssertionSuccess();
}

/// The Error text names the parameter, the value and says what is allowed.
inline ::testing::AssertionResult names(const std::string& msg, const std::vector<std::string>& parts) {
  for (const auto& p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << msg << "\" does not contain \"" << p << "\"";
  if (msg.find("allowed") == std::string::npos && msg.find("must") == std::string::npos &&
      msg.find("expected") == std::string::npos)
    return ::testing::AssertionFailure() << "message \"" << msg << "\" does not say what is allowed";
  return ::testing::AssertionSuccess();
}

/// Runs fn, which must throw decodegraph::Error; returns its message ("" with a test failure otherwise).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-decodegraph exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

/// Captures of the graph that bucket (batch, band) replays, from the stats (0 when it has none).
inline int captures_of(const ExecutorStats& st, int batch, int band) {
  for (const auto& g : st.graphs)
    if (g.batch == batch && g.band <= band && band <= g.last_band) return g.captures;
  return 0;
}

}  // namespace dgrel
