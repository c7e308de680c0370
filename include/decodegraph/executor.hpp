// The decode-step executor: captures the attention of a decode step (optionally the caller's whole
// step) into one CUDA graph per bucket (batch bucket x length band) and replays the right one each
// token step. Bands up to the V1/V2 threshold replay V1 graphs, longer ones V2 graphs.
//
// Typical loop:
//   Executor ex(config);                    // plans every bucket, allocates static buffers
//   for each token step:
//     write q (and new K/V) into ex.query(l) / ex.new_key(l) / ex.new_value(l), or fixed buffers
//     StepResult r = ex.step(inputs);       // validate, bucket, stage, replay (capture if lazy)
//     read ex.output(l)
//
// Stream ordering (CUDA backend): step() enqueues staging and the graph on ex.stream(), a
// non-blocking stream, and returns without waiting. Make your writes of q / new K/V / device inputs
// visible before step() (enqueue them on ex.stream(), or synchronise), and synchronise ex.stream()
// (or make your stream wait on it) before reading outputs. Layers share one V2 workspace: a step
// body must not run two layers' attention concurrently on forked streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/types.hpp"

namespace decodegraph {

enum class BackendKind : int { kAuto = 0, kCuda = 1, kHost = 2 };
enum class CapturePolicy : int { kUpFront = 0, kLazy = 1 };
/// kCheap: counts, lengths and table width. kFull: also every block id against num_blocks and
/// every slot against the cache size.
enum class ValidationLevel : int { kCheap = 0, kFull = 1 };
/// Where step inputs (seq_lens, block tables, slot mapping) live.
enum class MemorySpace : int { kHost = 0, kDevice = 1 };

const char* to_string(BackendKind kind);
const char* to_string(CapturePolicy policy);

#ifdef NDEBUG
inline constexpr ValidationLevel kDefaultValidation = ValidationLevel::kCheap;
#else
inline constexpr ValidationLevel kDefaultValidation = ValidationLevel::kFull;
#endif

/// Per-layer buffers. KV caches are required. q/out/new K/V are optional: where null the executor
/// owns a buffer (exposed by query()/output()/new_key()/new_value()); where set, the address is fixed
/// into the graphs at capture, so it must stay valid for the executor's lifetime.
struct LayerBuffers {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  void* q = nullptr;          // [max_batch, num_q_heads, head_size]
  void* out = nullptr;        // [max_batch, num_q_heads, head_size]
  void* new_key = nullptr;    // [max_batch, num_kv_heads, head_size]
  void* new_value = nullptr;  // [max_batch, num_kv_heads, head_size]
};

struct ExecutorConfig {
  AttentionSpec spec;
  /// ALiBi slopes [num_q_heads] (host values; copied into executor memory). Empty: no ALiBi.
  std::vector<float> alibi_slopes;

  int num_layers = 1;
  std::vector<LayerBuffers> layers;  // size num_layers
  int max_batch = 8;
  int max_seq_len = 8192;
  int num_blocks = 0;
  /// Block-table row width; 0 means ceil(max_seq_len / block_size).
  int max_blocks_per_seq = 0;

  /// Bands with upper edge <= threshold run V1; longer bands run V2.
  int v2_threshold = 8192;
  /// Upper edges of the length bands, increasing, containing v2_threshold (when < max_seq_len) and
  /// ending at max_seq_len. Empty: powers of two from 512 up to max_seq_len, plus the threshold.
  std::vector<int> band_edges;
  /// Captured batch sizes, increasing, ending at max_batch. Empty: 1, 2, 4, 8, then steps of 8 up to
  /// 256 and of 16 beyond, capped at max_batch (which is always a bucket).
  std::vector<int> batch_buckets;
  /// V2 partition size: a multiple of block_size, or 0 for "auto" (per bucket: the largest multiple
  /// of block_size >= 256 that still puts at least one full wave of blocks on the SMs).
  int partition_size = 0;
  /// SM count for auto partitioning; 0 = query the device (host backend: 132, an H200).
  int num_sms = 0;

  CapturePolicy capture = CapturePolicy::kLazy;
  BackendKind backend = BackendKind::kAuto;
  ValidationLevel validation = kDefaultValidation;
  /// Attention-only step: append each layer's new K/V at slot_mapping before its attention.
  bool append_kv = true;
  /// Device memory the executor may use (static buffers + workspace + graphs); 0 = unlimited.
  /// Buffers are checked at construction, each graph at its capture (kUpFront: construction); a
  /// bucket whose graph does not fit throws on every step that needs it, without being recaptured.
  std::size_t memory_budget_bytes = 0;
  /// Log level: trace, debug, info, warn, err, critical or off, in any case. An unknown name here
  /// is the caller's own argument and throws InvalidArgument. Empty: the DECODEGRAPH_LOG_LEVEL
  /// environment variable, where an unknown value only warns (once per value) and keeps "warn";
  /// else "warn".
  std::string log_level;
};

/// The host-only plan of one bucket.
struct BucketPlan {
  int batch = 0;         // bucket batch size
  int band = 0;          // band index
  int band_lo = 0;       // lengths in (band_lo, band_hi]
  int band_hi = 0;
  KernelKind kernel = KernelKind::kV1;
  int partition_size = 0;  // V2 only
  int max_partitions = 0;  // V2 only
  int grid_x = 0, grid_y = 0, grid_z = 0;     // attention (V1 or V2 pass 1) grid
  int merge_grid_x = 0, merge_grid_y = 0;     // V2 pass 2 grid
  std::size_t workspace_bytes = 0;            // V2 partials
};

/// Formats plans as an aligned text table (for logs, the CLI and bug reports).
std::string format_plan_table(const std::vector<BucketPlan>& plans);

struct StepInputs {
  int num_seqs = 0;
  const int32_t* seq_lens = nullptr;      // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, block_table_stride]
  int block_table_stride = 0;             // entries per row, <= max_blocks_per_seq... or wider
  const int64_t* slot_mapping = nullptr;  // [num_seqs]; required when KV append runs
  MemorySpace space = MemorySpace::kHost;
};

struct StepResult {
  int batch_bucket = 0;
  int band = 0;
  int band_hi = 0;
  KernelKind kernel = KernelKind::kV1;
  int partition_size = 0;
  bool captured = false;  // this step captured (and instantiated) the bucket's graph
};

class Executor;

/// Given to the step body while a bucket is captured. What it enqueues becomes the bucket's graph.
class StepContext {
 public:
  /// The stream being captured (CUDA backend). Launch your own kernels on it.
  Stream stream() const;
  BackendKind backend() const;
  const BucketPlan& plan() const;
  /// Appends layer l's new K/V (staged slot_mapping) into its cache.
  void append_kv(int layer);
  /// Attention for layer l on its q/out buffers.
  void attention(int layer);
  /// Attention for layer l on caller buffers fixed into the graph.
  void attention(int layer, const void* q, void* out);
  /// Records host work into the graph (host backend only; rejected on CUDA, use stream()).
  void enqueue_host(std::function<void()> fn);
  /// Staged device (or host-backend) copies: seq_lens [batch], block_tables, slot_mapping.
  const int32_t* seq_lens() const;
  const int32_t* block_tables() const;
  const int64_t* slot_mapping() const;

 private:
  friend class Executor;
  struct Impl;
  explicit StepContext(Impl* impl) : impl_(impl) {}
  Impl* impl_;
};

using StepBody = std::function<void(StepContext&)>;

struct GraphStats {
  int batch = 0;
  int band = 0;
  KernelKind kernel = KernelKind::kV1;  // what the bucket's graph runs
  int captures = 0;
  long long replays = 0;
  int nodes = 0;
  double capture_ms = 0;
  double instantiate_ms = 0;
};

struct ExecutorStats {
  std::vector<GraphStats> graphs;  // one per captured bucket
  long long steps = 0;
  long long rejected_steps = 0;
  int total_captures = 0;
  long long replays(KernelKind kind) const;
};

struct MemoryReport {
  std::size_t static_buffers = 0;  // staged inputs, owned q/out/new K/V, alibi
  std::size_t workspace = 0;       // V2 partials (largest plan)
  std::size_t graphs = 0;          // graph memory reported by the driver (0 on host)
  std::size_t total() const { return static_buffers + workspace + graphs; }
};

class Executor {
 public:
  explicit Executor(ExecutorConfig config, StepBody body = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  Executor(Executor&&) noexcept;
  Executor& operator=(Executor&&) noexcept;

  /// Validates, buckets, stages and replays one decode step. Throws Error on bad input and leaves the
  /// executor unchanged.
  StepResult step(const StepInputs& inputs);
  /// Captures every bucket now (what CapturePolicy::kUpFront does in the constructor).
  void capture_all();

  BackendKind backend() const;
  const ExecutorConfig& config() const;
  const std::vector<BucketPlan>& plans() const;
  const BucketPlan& plan_for(int batch_bucket_index, int band) const;
  std::string plan_table() const;
  ExecutorStats stats() const;
  MemoryReport memory() const;
  /// The stream steps run on (CUDA backend); nullptr on host.
  Stream stream() const;

  /// Layer buffers (device memory on CUDA, host memory on the host backend).
  void* query(int layer);
  void* output(int layer);
  void* new_key(int layer);
  void* new_value(int layer);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Default bands and buckets, exposed for tests and tools.
std::vector<int> default_band_edges(int max_seq_len, int v2_threshold);
std::vector<int> default_batch_buckets(int max_batch);
/// Auto partition size for a bucket (see ExecutorConfig::partition_size).
int auto_partition_size(const AttentionSpec& spec, int batch, int band_hi, int num_sms);

}  // namespace decodegraph
