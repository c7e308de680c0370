// Helpers shared by the benchmarks and decode_loop: model presets, the bytes model of docs/design.md,
// percentiles, seeded random fills (host, and device on CUDA builds), shuffled block ids on the device
// and the streaming-read kernel that measures the device's read bandwidth in the same run. The .cpp
// formats with fmt; this header includes none of it, so the .cu files that include it need no fmt
// under nvcc.
//
// Bench code may abort on a CUDA error (only tests and benches may); the library never does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "decodegraph/decodegraph.hpp"

#if DECODEGRAPH_HAS_CUDA
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define DGB_CUDA_CHECK(call)                                                                   \
  do {                                                                                         \
    const cudaError_t dgb_err_ = (call);                                                       \
    if (dgb_err_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(dgb_err_), __FILE__, \
                   __LINE__, cudaGetErrorString(dgb_err_));                                    \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
#endif

namespace dgbench {

/// A named attention shape (per layer).
struct ModelPreset {
  const char* name;
  const char* description;
  int q_heads;
  int kv_heads;
  int head_size;
  int block_size;
  decodegraph::DType dtype;
  // The attention variants (issue 17), from the model's published config.
  float scale = 0.0f;     // softmax scale; 0: 1/sqrt(head_size)
  int window = 0;         // sliding window W of the local layers (HF convention); 0: none
  int global_every = 0;   // layer l is global (no window) when (l + 1) % global_every == 0; 0: all local
  float softcap = 0.0f;   // attn_logit_softcapping; 0: none
  bool sinks = false;     // learned attention sinks in every layer
};

/// llama3-8b (32q/8kv), llama3-70b-tp8 (8q/1kv), mha (32q/32kv): head 128, block 16, bf16;
/// "small" (8q/2kv, head 64), the CPU-friendly default of the host backend; and the windowed
/// models gpt-oss-20b, gemma-2-9b, gemma-3-27b (their descriptions name the config they follow).
const std::vector<ModelPreset>& model_presets();
/// nullptr when unknown.
const ModelPreset* find_preset(std::string_view name);
/// The preset's shape and scale (no window: layer_spec_of gives each layer's).
decodegraph::AttentionSpec spec_of(const ModelPreset& preset);
/// Layer l's spec: `base` with the preset's soft-cap and, on its local layers, its window.
decodegraph::AttentionSpec layer_spec_of(const ModelPreset& preset, const decodegraph::AttentionSpec& base, int layer);

/// The bytes model (docs/design.md, "Performance model"): bytes of one layer's attention for one step:
///   sum over sequences of 2 * len * kv_heads * head_size * bytes(kv)      (K and V read; fp8: 1;
///     a sliding window's len: the tokens it reads, from the window's first block on)
///   + q read and out written                                 (num_seqs x q_len x q_heads x D each)
///   + V2 only: partials written by pass 1 and read by pass 2, per partition (max logit, exp sum and
///     head_size partial outputs, fp32), for each sequence's ceil(len/P) partitions and q_len rows.
/// q_len > 1 (speculative decoding): K and V count once for all of a sequence's rows, and a window
/// reads W + q_len - 1 tokens (from row 0's window on). Rows with len 0 (padding) move nothing. A KV
/// head's rows past 16 split into head chunks whose blocks each read K and V (mostly from L2): the
/// planner's cost model counts those reads, this model of the work does not (docs/design.md).
double attention_bytes(const decodegraph::AttentionSpec& spec, const int32_t* seq_lens, int num_seqs,
                       decodegraph::KernelKind kernel, int partition_size, int q_len = 1);
/// The K and V part of attention_bytes alone: what the kernels read from the cache.
double attention_kv_bytes(const decodegraph::AttentionSpec& spec, const int32_t* seq_lens, int num_seqs,
                          int q_len = 1);
/// KV bytes of a context of `len` tokens for one layer (K and V).
double kv_bytes(const decodegraph::AttentionSpec& spec, long long len);

/// Whether the KV append put every new token where attention reads it (host memory): token j of
/// sequence i (row i * q_len + j of key / value, [num_seqs * q_len, kv_heads, head_size]) sits at
/// position seq_lens[i] - q_len + j, found through block_tables (not through a slot mapping), and the
/// cache must hold its K and V there, bitwise (fp8: the code of x / scale). Sequences of length 0 are
/// skipped. Returns "" when every token is there, else the first one that is not.
std::string appended_kv_mismatch(const decodegraph::AttentionSpec& spec, const void* k_cache, const void* v_cache,
                                 const float* k_scale, const float* v_scale, const void* key, const void* value,
                                 const int32_t* seq_lens, const int32_t* block_tables, int block_table_stride,
                                 int num_seqs, int q_len);

/// p in [0, 100]; linear interpolation between order statistics. 0 for an empty sample.
double percentile(std::vector<double> values, double p);

/// Seeded uniform values in [-1, 1) rounded to dtype (splitmix64: fast enough for GBs of cache).
/// Never all zeros.
void fill_random_host(decodegraph::DType dtype, void* buf, std::size_t n, std::uint64_t seed);

/// The scale of fp8 caches the fills write: codes of uniform values in [-1, 1) / kFillKvScale, so
/// that code * kFillKvScale is in [-1, 1) like the other dtypes' fills (codes up to 256: E4M3's
/// max is 448).
inline constexpr float kFillKvScale = 1.0f / 256;
/// A KV cache of `spec` (n elements): fill_random_host for kv_dtype auto, else fp8 codes of
/// uniform [-1, 1) / kFillKvScale. Never all zeros.
void fill_random_kv_host(const decodegraph::AttentionSpec& spec, void* buf, std::size_t n, std::uint64_t seed);

/// "1.5 GiB", "512 KiB".
std::string format_bytes(double bytes);

/// Renders rows as an aligned text table (first row is the header).
std::string format_table(const std::vector<std::vector<std::string>>& rows);

/// printf into a std::string. Kept for bench_attention.cpp; new code formats with fmt::format.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/// Result of the streaming-read measurement (bench/bandwidth.cu).
struct ReadBandwidth {
  double median_gbs = 0;  // median over iterations, GB/s = 1e9 bytes/s
  double best_gbs = 0;
  std::size_t buffer_bytes = 0;
  int iterations = 0;
};

#if DECODEGRAPH_HAS_CUDA
/// Seeded uniform values in [-1, 1) rounded to dtype, written on the device (bench/device_fill.cu).
void fill_random_device(decodegraph::DType dtype, void* buf, std::size_t n, std::uint64_t seed,
                        cudaStream_t stream);
/// fill_random_kv_host's values, written on the device.
void fill_random_kv_device(const decodegraph::AttentionSpec& spec, void* buf, std::size_t n, std::uint64_t seed,
                           cudaStream_t stream);

/// ids[0..n) = a seeded uniform random permutation of 0..n-1, written on `stream` (asynchronous;
/// bench/device_tables.cu). Slices of it are disjoint, shuffled block tables.
void shuffled_block_ids_device(int32_t* ids, std::size_t n, std::uint64_t seed, cudaStream_t stream);

/// Reads a buffer of `bytes` (make it far larger than L2) with 16-byte loads, `iters` timed passes
/// after one warm-up pass, timed with CUDA events.
ReadBandwidth measure_read_bandwidth(std::size_t bytes, int iters);
/// Device-to-device cudaMemcpyAsync of a `bytes` buffer; GB/s counts bytes read + bytes written.
ReadBandwidth measure_copy_bandwidth(std::size_t bytes, int iters);
/// Default buffer size: 16x the device's L2, at least 1 GiB, at most a quarter of free memory.
std::size_t default_bandwidth_buffer_bytes();
#endif

}  // namespace dgbench
