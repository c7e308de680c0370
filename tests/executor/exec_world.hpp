// A small decode world for executor tests: per-layer paged KV caches (host memory for the host
// backend), sequences with distinct blocks, step inputs (lengths, block tables, slot mapping), random
// q / new K / new V written into the executor's buffers, and the float64 reference of each layer.
// fp8 caches (spec.kv_dtype): random codes, per-layer scales (k_scales[l], v_scales[l], host memory
// the layers point at), the append checked code by code. Steps of q_len > 1 tokens per sequence
// (speculative decoding, set_lens' q_len): rows [num_seqs, q_len], slots of positions L - q_len + j.
#pragma once

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/executor.hpp"
#include "decodegraph/fault.hpp"
#include "kernels/decode_math.hpp"
#include "test_util.hpp"

namespace dgtest {

using namespace decodegraph;

/// Per-dtype tolerances: output rounding to the dtype (rtol ~ half-ulp) plus fp32 accumulation
/// slack for outputs near zero (atol); inputs in [-1, 1].
struct Tol {
  double atol, rtol;
};
inline Tol tol_for(DType d) {
  switch (d) {
    case DType::kFloat32: return {2e-5, 1e-4};    // fp32 accumulation over up to ~8K tokens
    case DType::kFloat16: return {1e-3, 2e-3};    // half-ulp 4.9e-4 relative
    case DType::kBFloat16: return {8e-3, 1.6e-2};  // half-ulp 3.9e-3 relative
  }
  return {0, 0};
}

/// A small spec: 4 q heads over 2 KV heads of 64, blocks of 16.
inline AttentionSpec small_spec(DType dtype = DType::kFloat32, KVLayout layout = KVLayout::kVLLM) {
  AttentionSpec s;
  s.num_q_heads = 4;
  s.num_kv_heads = 2;
  s.head_size = 64;
  s.block_size = 16;
  s.dtype = dtype;
  s.layout = layout;
  return s;
}

/// Runs fn, which must throw InvalidArgument whose message contains every part.
template <class F>
::testing::AssertionResult rejects(F&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      if (msg.find(p) == std::string::npos) return ::testing::AssertionFailure() << "'" << p << "' not in: " << msg;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not an InvalidArgument: " << e.what();
  }
  return ::testing::AssertionFailure() << "nothing thrown; expected " << parts.front();
}

/// The kernel ("v1" or "v2") of the attention launch `run` reaches after `skip` other kernel
/// launches, read off the host twin's launch name: kKernelLaunch is armed to fail it, so `run`
/// throws there. Independent of the counters the executor keeps.
inline std::string failing_kernel(const std::function<void()>& run, int skip) {
  fault::ScopedFault f(fault::Site::kKernelLaunch, skip);
  try {
    run();
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.find("paged_attention_v1") != std::string::npos) return "v1";
    if (m.find("paged_attention_v2") != std::string::npos) return "v2";
    return "other: " + m;
  }
  return "no failure";
}

struct World {
  AttentionSpec spec;  // layer 0's: the config's spec, whose block size, dtype and layout every layer shares
  std::vector<AttentionSpec> specs;  // [num_layers]: each layer's (ExecutorConfig::layer_specs when they differ)
  int num_layers = 1;
  int num_blocks = 0;
  int stride = 0;  // block-table row width of the caller's tables
  std::vector<Buffer> k, v;
  std::vector<std::vector<float>> k_scales, v_scales;  // fp8: [layer][spec.kv_scale_count()]
  std::vector<std::vector<float>> sinks;  // [layer][num_q_heads], or empty for none (set_sinks)
  std::mt19937_64 rng;

  // Current step inputs.
  std::vector<int32_t> lens, tables;
  std::vector<int64_t> slots;  // [num_seqs, q_len]
  int q_len = 1;               // query tokens per sequence of the current step
  // Each sequence's blocks (distinct across sequences, fixed for the world's lifetime).
  std::vector<std::vector<int32_t>> seq_blocks;

  World(AttentionSpec s, int layers, int max_seqs, int max_len, uint64_t seed = 1)
      : World(std::vector<AttentionSpec>(static_cast<std::size_t>(layers), s), max_seqs, max_len, seed) {}

  /// One spec per layer: each layer's cache, q, out and new K/V follow its own.
  World(std::vector<AttentionSpec> per_layer, int max_seqs, int max_len, uint64_t seed = 1)
      : spec(per_layer.at(0)), specs(per_layer), num_layers(static_cast<int>(per_layer.size())), rng(seed) {
    const AttentionSpec& s = spec;
    stride = (max_len + s.block_size - 1) / s.block_size;
    num_blocks = max_seqs * stride + 3;  // a few blocks nobody owns
    for (int l = 0; l < num_layers; ++l) {
      const AttentionSpec& ls = specs[l];  // this layer's heads, head size and cache dtype
      const std::size_t elems = static_cast<std::size_t>(num_blocks) * ls.block_elems();
      k.emplace_back(elems * ls.kv_elem_size());
      v.emplace_back(elems * ls.kv_elem_size());
      k_scales.emplace_back();
      v_scales.emplace_back();
      sinks.emplace_back();
      if (ls.fp8_kv()) {
        // Values in [-1, 1) as codes at scale 1/64 (K) and 1/128 (V): codes up to 64 / 128.
        k_scales.back().assign(ls.kv_scale_count(), 1.0f / 64);
        v_scales.back().assign(ls.kv_scale_count(), 1.0f / 128);
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        for (std::size_t e = 0; e < elems; ++e) {
          static_cast<uint8_t*>(k.back().data())[e] = float_to_fp8_bits(ls.kv_dtype, u(rng) * 64);
          static_cast<uint8_t*>(v.back().data())[e] = float_to_fp8_bits(ls.kv_dtype, u(rng) * 128);
        }
      } else {
        fill_uniform(s.dtype, k.back().data(), elems, rng);
        fill_uniform(s.dtype, v.back().data(), elems, rng);
      }
    }
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    seq_blocks.resize(max_seqs);
    for (int i = 0; i < max_seqs; ++i)
      seq_blocks[i].assign(ids.begin() + i * stride, ids.begin() + (i + 1) * stride);
  }

  ExecutorConfig config(int max_batch, int max_seq_len) {
    ExecutorConfig c;
    c.spec = spec;
    if (std::any_of(specs.begin(), specs.end(), [&](const AttentionSpec& x) { return !(x == spec); })) c.layer_specs = specs;
    c.num_layers = num_layers;
    for (int l = 0; l < num_layers; ++l) {
      LayerBuffers lb;
      lb.k_cache = k[l].data();
      lb.v_cache = v[l].data();
      if (specs[l].fp8_kv()) {
        lb.k_scale = k_scales[l].data();
        lb.v_scale = v_scales[l].data();
      }
      if (!sinks[l].empty()) lb.sinks = sinks[l].data();
      lb.k_cache_bytes = k[l].bytes;  // the host backend cannot ask for an allocation's size
      lb.v_cache_bytes = v[l].bytes;
      c.layers.push_back(lb);
    }
    c.max_batch = max_batch;
    c.max_seq_len = max_seq_len;
    c.num_blocks = num_blocks;
    c.backend = BackendKind::kHost;
    c.validation = ValidationLevel::kFull;
    return c;
  }

  /// Step inputs for sequences 0..n-1 with these lengths and `tokens` (q_len) new tokens each:
  /// token j of sequence i goes to position len - tokens + j of its own blocks (q_len 1: len - 1).
  void set_lens(const std::vector<int>& new_lens, int tokens = 1) {
    const int n = static_cast<int>(new_lens.size());
    q_len = tokens;
    lens.assign(new_lens.begin(), new_lens.end());
    tables.assign(static_cast<std::size_t>(n) * stride, -7);  // unused entries hold junk
    slots.resize(static_cast<std::size_t>(n) * q_len);
    for (int i = 0; i < n; ++i) {
      const int used = (lens[i] + spec.block_size - 1) / spec.block_size;
      for (int j = 0; j < used; ++j) tables[static_cast<std::size_t>(i) * stride + j] = seq_blocks[i][j];
      for (int j = 0; j < q_len; ++j) slots[static_cast<std::size_t>(i) * q_len + j] = slot_of(i, lens[i] - q_len + j);
    }
  }

  /// The cache slot of position `pos` of sequence i.
  int64_t slot_of(int i, int pos) const {
    return static_cast<int64_t>(seq_blocks[i][pos / spec.block_size]) * spec.block_size + pos % spec.block_size;
  }

  /// Query (and output, new K/V) rows of the current step: num_seqs x q_len.
  int rows() const { return static_cast<int>(lens.size()) * q_len; }

  /// Random attention sinks in [lo, hi) for every layer (call before config()).
  void set_sinks(float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    for (int l = 0; l < num_layers; ++l) {
      sinks[l].resize(static_cast<std::size_t>(specs[l].num_q_heads));
      for (float& x : sinks[l]) x = u(rng);
    }
  }

  /// A sliding window's freed blocks in layer l's caches, for the current lengths: NaN in K and V
  /// of every block wholly before sequence i's window (positions < len - W). Their table entries
  /// stay valid (layers without a window, sharing the tables, still read them). Lengths must not
  /// shrink afterwards (a window moving back would read the NaN).
  void poison_outside_window(int l) {
    const AttentionSpec& s = specs[l];
    if (s.sliding_window == 0) return;
    const std::size_t elems = s.block_elems();
    for (std::size_t i = 0; i < lens.size(); ++i) {
      const int first = lens[i] > s.sliding_window ? lens[i] - s.sliding_window : 0;
      for (int j = 0; j < first / s.block_size; ++j) {
        const std::size_t base = static_cast<std::size_t>(seq_blocks[i][j]) * elems;
        for (Buffer* b : {&k[l], &v[l]}) {
          if (s.fp8_kv()) std::memset(static_cast<uint8_t*>(b->data()) + base, 0x7f, elems);  // NaN codes
          else
            for (std::size_t e = 0; e < elems; ++e) store_from_float(s.dtype, b->data(), base + e, NAN);
        }
      }
    }
  }
  /// Every table entry before the first block that any layer's window reads (the widest window's)
  /// becomes an invalid id, as vLLM points freed blocks at a null block: only when every layer has
  /// a window.
  void free_entries_outside_windows() {
    int widest = 0;
    for (const AttentionSpec& s : specs) {
      if (s.sliding_window == 0) return;
      widest = std::max(widest, s.sliding_window);
    }
    for (std::size_t i = 0; i < lens.size(); ++i) {
      const int first = lens[i] > widest ? lens[i] - widest : 0;
      for (int j = 0; j < first / spec.block_size; ++j)
        tables[i * stride + j] = j % 2 ? -1 : num_blocks + 99;
    }
  }

  StepInputs inputs() const {
    StepInputs in;
    in.num_seqs = static_cast<int>(lens.size());
    in.seq_lens = lens.data();
    in.block_tables = tables.data();
    in.block_table_stride = stride;
    in.slot_mapping = slots.data();
    in.q_len = q_len;
    return in;
  }

  /// Elements of n rows of layer l's q (or out) and new K (or V).
  std::size_t q_elems(int n, int l = 0) const {
    return static_cast<std::size_t>(n) * specs[l].num_q_heads * specs[l].head_size;
  }
  std::size_t kv_elems(int n, int l = 0) const {
    return static_cast<std::size_t>(n) * specs[l].num_kv_heads * specs[l].head_size;
  }

  /// Random q and new K/V for the live rows of every layer, written into the executor's buffers.
  void fill_step(Executor& ex) {
    const int n = rows();
    for (int l = 0; l < num_layers; ++l) {
      fill_uniform(spec.dtype, ex.query(l), q_elems(n, l), rng);
      fill_uniform(spec.dtype, ex.new_key(l), kv_elems(n, l), rng);
      fill_uniform(spec.dtype, ex.new_value(l), kv_elems(n, l), rng);
    }
  }

  /// float64 reference of layer l over the current inputs (after the step's append).
  std::vector<double> reference(int l, const void* q, const float* alibi = nullptr) const {
    const int n = static_cast<int>(lens.size());
    DecodeArgs a;
    a.spec = specs[l];
    a.num_seqs = n;
    a.q_len = q_len;
    a.max_seq_len = *std::max_element(lens.begin(), lens.end());
    a.block_table_stride = stride;
    a.num_blocks = num_blocks;
    a.q = q;
    a.out = const_cast<void*>(q);  // not written by the reference; validation wants a pointer
    a.k_cache = k[l].data();
    a.v_cache = v[l].data();
    a.block_tables = tables.data();
    a.seq_lens = lens.data();
    a.alibi_slopes = alibi;
    if (!sinks[l].empty()) a.sinks = sinks[l].data();
    if (specs[l].fp8_kv()) {
      a.k_scale = k_scales[l].data();
      a.v_scale = v_scales[l].data();
    }
    std::vector<double> ref(q_elems(rows(), l), 0.0);
    reference::paged_attention(a, ref.data());
    return ref;
  }

  ::testing::AssertionResult check_layer(Executor& ex, int l, const float* alibi = nullptr) const {
    const std::vector<double> ref = reference(l, ex.query(l), alibi);
    const Tol t = tol_for(spec.dtype);
    return check_close(spec.dtype, ex.output(l), ref.data(), rows(), specs[l].num_q_heads, specs[l].head_size,
                       t.atol, t.rtol);
  }

  /// Cache element offsets of each new token (row t = i * q_len + j, at slots[t]; skipped where
  /// negative): compares K and V with new_key/new_value row t.
  /// fp8 caches: the codes of new_key / k_scale and new_value / v_scale (numeric.hpp's rounding).
  ::testing::AssertionResult check_appended(Executor& ex, int l) const {
    const AttentionSpec& spec = specs[l];  // this layer's heads, head size and cache dtype
    const int x = math::vllm_x(static_cast<int>(spec.kv_elem_size()));
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const int64_t slot = slots[i];
      if (slot < 0) continue;
      const int64_t block = slot / spec.block_size;
      const int tok = static_cast<int>(slot % spec.block_size);
      for (int h = 0; h < spec.num_kv_heads; ++h)
        for (int d = 0; d < spec.head_size; ++d) {
          const std::size_t src = (i * spec.num_kv_heads + h) * spec.head_size + d;
          const int64_t ko = math::k_offset(spec.layout, block, h, tok, d, spec.num_kv_heads, spec.head_size,
                                            spec.block_size, x);
          const int64_t vo = math::v_offset(spec.layout, block, h, tok, d, spec.num_kv_heads, spec.head_size,
                                            spec.block_size);
          float ek = load_as_float(spec.dtype, ex.new_key(l), src);
          float ev = load_as_float(spec.dtype, ex.new_value(l), src);
          if (spec.fp8_kv()) {
            const int si = spec.kv_scale_per_head ? h : 0;
            ek = fp8_bits_to_float(spec.kv_dtype, float_to_fp8_bits(spec.kv_dtype, ek / k_scales[l][si]));
            ev = fp8_bits_to_float(spec.kv_dtype, float_to_fp8_bits(spec.kv_dtype, ev / v_scales[l][si]));
          }
          const float gk = load_kv_as_float(spec, k[l].data(), ko);
          const float gv = load_kv_as_float(spec, v[l].data(), vo);
          if (gk != ek || gv != ev)
            return ::testing::AssertionFailure() << "layer " << l << " row " << i << " (seq " << i / q_len << ", token "
                                                 << i % q_len << ") head " << h << " d " << d
                                                 << ": cache K " << gk << " V " << gv << ", appended K " << ek
                                                 << " V " << ev;
        }
    }
    return ::testing::AssertionSuccess();
  }
};

}  // namespace dgtest
