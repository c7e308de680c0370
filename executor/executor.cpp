// The decode-step executor: configuration -> plans -> static buffers -> graphs, and step():
// validate, pick the bucket, stage the inputs into the static buffers, replay the bucket's graph
// (measuring its candidates first under kMeasured, capturing first when lazy). Buckets whose launches
// are identical share one graph (one GraphSlot). Backend-neutral; the backends live in
// host_backend.cpp and cuda/.
//
// Band choice (BandSelect): under kHost step() finds the band on the host and replays that plan's
// graph; under kDevice each batch bucket has one graph (a GraphSlot with switch_bucket set) that
// starts with the band-select node and turns every attention call into a SWITCH node over the
// bucket's bands, so step() only stages and replays.
//
// NOTE(graph): every pointer a captured op reads (seq_lens, block_tables, slot_mapping, q/out/new
// K/V, workspace, alibi, the bad-block flag) is allocated once here and never moves; what changes
// between steps is written into those buffers by staging, never baked into a launch. Caller
// buffers move only through rebind_layers, which re-captures and updates every graph.
#include "decodegraph/executor.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "decodegraph/error.hpp"
#include "executor/backend.hpp"
#include "executor/nvtx.hpp"
#include "executor/plan.hpp"
#include "kernels/band_select.cuh"

namespace decodegraph {

using detail::Backend;
using detail::BackendGraph;

namespace {

std::shared_ptr<spdlog::logger> dg_logger() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("decodegraph")) return existing;
    try {
      return spdlog::stderr_color_mt("decodegraph");
    } catch (const spdlog::spdlog_ex&) {  // registered concurrently by someone else
      return spdlog::get("decodegraph");
    }
  }();
  return logger;
}

constexpr const char* kLevelNames = "trace, debug, info, warn, err, critical, off (any case)";

/// A log level name in any case ("warning" and "error" too); nullopt for anything else.
std::optional<spdlog::level::level_enum> parse_level(std::string name) {
  using spdlog::level::level_enum;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::pair<const char*, level_enum> kNames[] = {
      {"trace", level_enum::trace}, {"debug", level_enum::debug},       {"info", level_enum::info},
      {"warn", level_enum::warn},   {"warning", level_enum::warn},      {"err", level_enum::err},
      {"error", level_enum::err},   {"critical", level_enum::critical}, {"off", level_enum::off}};
  for (const auto& [n, lvl] : kNames)
    if (name == n) return lvl;
  return std::nullopt;
}

/// A bad DECODEGRAPH_LOG_LEVEL is the environment's mistake, not the caller's: warn once per
/// distinct value (not once per Executor) and keep the default.
void warn_bad_env_level(spdlog::logger& log, const std::string& value) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(value).second) return;
  }
  log.warn("DECODEGRAPH_LOG_LEVEL = \"{}\" is not a log level (allowed: {}); using the default, warn",
           value, kLevelNames);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Ends an abandoned capture when the code being captured throws; disarm once it is ended normally.
struct AbortCapture {
  Backend* b;
  bool armed = true;
  ~AbortCapture() {
    if (armed) b->abort_capture();
  }
};

/// Calls end_step() when a step ends, also when it throws.
struct EndStep {
  Backend* b;
  ~EndStep() { b->end_step(); }
};

std::string mib(std::size_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

std::string ptr_text(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

/// True when [p, p + n) overlaps [base, base + bytes).
bool overlaps(const void* p, std::size_t n, const void* base, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(base);
  return a < b + bytes && b < a + std::max<std::size_t>(n, 1);
}

}  // namespace

long long ExecutorStats::replays(KernelKind kind) const {
  long long n = 0;
  for (const GraphStats& g : graphs) {
    if (!g.switch_graph) {
      if (g.kernel == kind) n += g.replays;
      continue;
    }
    for (std::size_t b = 0; b < g.band_replays.size() && b < g.band_kernels.size(); ++b)
      if (g.band_kernels[b] == kind) n += g.band_replays[b];
  }
  return n;
}

// ---------------------------------------------------------------- Impl

struct Executor::Impl {
  // Declared first so it is destroyed last: every buffer below is freed through it.
  std::unique_ptr<Backend> backend;
  std::shared_ptr<spdlog::logger> log;
  ExecutorConfig cfg;
  StepBody body;
  std::vector<BucketPlan> plans;  // bucket-major: bucket * num_bands + band
  int num_bands = 0;
  std::vector<int> bucket_of_batch;  // [max_batch + 1]: batch bucket index for each num_seqs

  struct Owned {  // executor memory, freed on destruction
    Backend* b = nullptr;
    void* p = nullptr;
    bool host = false;
    Owned() = default;
    Owned(Backend* be, void* ptr, bool h) : b(be), p(ptr), host(h) {}
    Owned(Owned&& o) noexcept : b(o.b), p(std::exchange(o.p, nullptr)), host(o.host) {}
    Owned& operator=(Owned&&) = delete;
    ~Owned() {
      if (p) host ? b->free_host(p) : b->free(p);
    }
  };
  std::vector<Owned> owned;

  // Static buffers (executor memory, fixed addresses).
  int32_t* seq_lens = nullptr;      // [max_batch]
  int32_t* block_tables = nullptr;  // [max_batch, max_blocks_per_seq]
  int64_t* slot_mapping = nullptr;  // [max_batch]
  float* alibi = nullptr;           // [num_q_heads] or null
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  void* measure_out = nullptr;  // kMeasured: [max_batch, num_q_heads, head_size], candidates write here
  std::vector<LayerBuffers> layers;  // resolved: caller or owned buffers
  /// Executor-owned q/out/new K/V per layer (null where the caller gives the buffer). Kept when a
  /// rebind hands a layer's buffer to the caller, reused when a later rebind hands it back.
  struct OwnedLayer {
    void* q = nullptr;
    void* out = nullptr;
    void* new_key = nullptr;
    void* new_value = nullptr;
  };
  std::vector<OwnedLayer> owned_layers;
  /// NOTE(graph): device int every attention launch reports its first clamped block id into
  /// (DecodeArgs::bad_block); each graph ends with a copy of it into bad_block_h (pinned), which the
  /// next step reads without any CUDA call. It is sticky: only a report resets it.
  int* bad_block = nullptr;
  int* bad_block_h = nullptr;
  long long reported_through = 0;  // steps up to here were covered by the last bad-block report

  // Host staging mirrors (pinned on CUDA) and scratch for validating device-resident inputs.
  int32_t* seq_lens_h = nullptr;
  int32_t* block_tables_h = nullptr;
  int64_t* slot_mapping_h = nullptr;
  std::vector<int32_t> seq_scratch, bt_scratch;
  std::vector<int64_t> slot_scratch;

  BandSelect band_mode = BandSelect::kHost;  // in effect, after any fallback
  std::string band_note;                     // why kDevice fell back
  int* edges_dev = nullptr;                  // kDevice: [num_bands] band edges (executor memory)
  unsigned long long* branch_counts = nullptr;  // kDevice: [buckets, num_bands] branch executions
  int switch_nodes = 0;                      // SWITCH nodes in the capture being recorded

  /// One distinct launch sequence: the graph every bucket with that plan replays.
  struct GraphSlot {
    BucketPlan plan;  // the launch plan; band fields span its buckets (StepContext::plan)
    std::vector<std::size_t> buckets;
    std::unique_ptr<BackendGraph> graph;  // null until captured
    GraphStats stats;
    std::size_t rejected_bytes = 0;  // bytes of a graph the memory budget rejected, 0 if none
    int switch_bucket = -1;  // kDevice: the batch bucket whose bands are this graph's branches
  };
  /// kHost: the graphs. kDevice: the distinct launch sequences (branch identities), never captured.
  std::vector<GraphSlot> slots;
  std::vector<GraphSlot> bucket_slots;  // kDevice: one graph per batch bucket
  std::map<detail::LaunchKey, int> slot_of_launch;
  long long steps = 0, rejected = 0;
  int total_captures = 0;
  int measured_buckets = 0, candidate_graphs = 0;
  double measure_ms = 0;
  int rebinds = 0, graph_updates = 0, graph_reinstantiations = 0;
  long long input_downloads = 0, staging_copy_bytes = 0, bad_block_reports = 0;
  std::size_t static_bytes = 0;

  std::size_t q_bytes() const {
    return static_cast<std::size_t>(cfg.max_batch) * cfg.spec.num_q_heads * cfg.spec.head_size *
           dtype_size(cfg.spec.dtype);
  }
  std::size_t kv_token_bytes() const {
    return static_cast<std::size_t>(cfg.max_batch) * cfg.spec.num_kv_heads * cfg.spec.head_size *
           dtype_size(cfg.spec.dtype);
  }
  void* alloc(std::size_t bytes) {
    owned.reserve(owned.size() + 1);  // so push_back cannot throw after the allocation
    void* p = backend->alloc(bytes);
    owned.emplace_back(backend.get(), p, false);
    return p;
  }
  void* alloc_host(std::size_t bytes) {
    owned.reserve(owned.size() + 1);
    void* p = backend->alloc_host(bytes);
    owned.emplace_back(backend.get(), p, true);
    return p;
  }
  std::size_t graph_bytes() const {
    std::size_t n = 0;
    for (const GraphSlot& g : slots)
      if (g.graph) n += g.graph->bytes();
    for (const GraphSlot& g : bucket_slots)
      if (g.graph) n += g.graph->bytes();
    return n;
  }
  void check_layer(int layer) const {
    if (layer < 0 || layer >= cfg.num_layers)
      throw_invalid("layer", layer, "0..num_layers-1 = 0.." + std::to_string(cfg.num_layers - 1));
  }
  std::size_t mirror_table_bytes() const {
    return static_cast<std::size_t>(cfg.max_batch) * cfg.max_blocks_per_seq * sizeof(int32_t);
  }

  /// What validate() learnt about the lengths: band_len sizes the band (kHost) and the staged table
  /// columns (0: not known, device inputs under kDevice without a hint); max_len is the longest
  /// length when the lengths were read on the host, else 0.
  struct Lengths {
    int band_len = 0;
    int max_len = 0;
  };
  StepResult step(const StepInputs& in, std::optional<Stream> stream);
  Lengths validate(const StepInputs& in);
  void check_staging_pointers(const StepInputs& in) const;
  void stage(const StepInputs& in, const BucketPlan& plan, int band_len);
  void stage_synthetic(const BucketPlan& plan);
  void stage_synthetic_rows(const BucketPlan& plan);
  void join(std::size_t idx);
  void measure(std::size_t idx);
  bool bucket_measured(int bucket) const;
  void measure_bucket(int bucket);
  void capture(std::size_t idx);
  void capture_slot(GraphSlot& slot, const std::string& what);
  void record(const BucketPlan& plan, int switch_bucket = -1);  // switch_bucket >= 0: kDevice
  void record_slot(GraphSlot& slot);
  void record_switch(GraphSlot& slot);
  BucketPlan bucket_graph_plan(int bucket) const;
  void check_graph_budget(const std::string& what, std::size_t bytes) const;
  void check_device_ranges(const std::vector<LayerBuffers>& given) const;
  std::size_t owned_bytes_missing(const std::vector<LayerBuffers>& given) const;
  std::vector<LayerBuffers> resolve_layers(const std::vector<LayerBuffers>& given);
  void report_bad_block(bool wait);
  void attention(const BucketPlan& plan, int layer, const void* q, void* out, int64_t q_stride,
                 int64_t out_stride);
  void attention_switch(int bucket, int layer, const void* q, void* out, int64_t q_stride, int64_t out_stride);
};

// ---------------------------------------------------------------- StepContext

struct StepContext::Impl {
  Executor::Impl* ex;
  const BucketPlan* plan;
  int switch_bucket = -1;  // kDevice: attention becomes a SWITCH node over this bucket's bands
};

Stream StepContext::stream() const { return impl_->ex->backend->stream(); }
BackendKind StepContext::backend() const { return impl_->ex->backend->kind(); }
const BucketPlan& StepContext::plan() const { return *impl_->plan; }
const int32_t* StepContext::seq_lens() const { return impl_->ex->seq_lens; }
const int32_t* StepContext::block_tables() const { return impl_->ex->block_tables; }
const int64_t* StepContext::slot_mapping() const { return impl_->ex->slot_mapping; }

void StepContext::append_kv(int layer) {
  Executor::Impl& ex = *impl_->ex;
  ex.check_layer(layer);
  AppendArgs a;
  a.spec = ex.cfg.spec;
  a.num_tokens = impl_->plan->batch;  // padded rows carry slot -1 and are skipped
  a.num_blocks = ex.cfg.num_blocks;
  a.key = ex.layers[layer].new_key;
  a.value = ex.layers[layer].new_value;
  a.key_stride = ex.layers[layer].new_key_stride;
  a.value_stride = ex.layers[layer].new_value_stride;
  a.k_cache = ex.layers[layer].k_cache;
  a.v_cache = ex.layers[layer].v_cache;
  a.slot_mapping = ex.slot_mapping;
  ex.backend->append(a);
}

void StepContext::attention(int layer) {
  impl_->ex->check_layer(layer);
  const LayerBuffers& lb = impl_->ex->layers[layer];
  attention(layer, lb.q, lb.out, lb.q_stride, lb.out_stride);
}

void StepContext::attention(int layer, const void* q, void* out, int64_t q_stride, int64_t out_stride) {
  Executor::Impl& ex = *impl_->ex;
  ex.check_layer(layer);
  require(q != nullptr, "q", "null", "a query buffer [max_batch, num_q_heads, head_size]");
  require(out != nullptr, "out", "null", "an output buffer [max_batch, num_q_heads, head_size]");
  if (impl_->switch_bucket >= 0)
    ex.attention_switch(impl_->switch_bucket, layer, q, out, q_stride, out_stride);
  else
    ex.attention(*impl_->plan, layer, q, out, q_stride, out_stride);
}

// kDevice: one SWITCH node whose branch `band` holds that band's plan's launches, exactly as kHost's
// graph of (bucket, band) would; bands with the same launches (graph_id) share one recording.
void Executor::Impl::attention_switch(int bucket, int layer, const void* q, void* out, int64_t q_stride,
                                      int64_t out_stride) {
  if (switch_nodes + 1 > kernels::kMaxSwitchHandles)
    throw_invalid("attention calls in one graph under BandSelect::kDevice", switch_nodes + 1,
                  "at most " + std::to_string(kernels::kMaxSwitchHandles) + " (one SWITCH node each)");
  ++switch_nodes;
  backend->begin_switch(num_bands);
  for (int band = 0; band < num_bands; ++band) {
    const BucketPlan& p = plans[static_cast<std::size_t>(bucket) * num_bands + band];
    if (backend->begin_branch(band, p.graph_id)) attention(p, layer, q, out, q_stride, out_stride);
    backend->end_branch();
  }
  backend->end_switch();
}

// One layer's attention as `p` launches it (a graph's plan, or a kMeasured candidate).
void Executor::Impl::attention(const BucketPlan& p, int layer, const void* q, void* out, int64_t q_stride,
                               int64_t out_stride) {
  DecodeArgs a;
  a.spec = cfg.spec;
  a.num_seqs = p.batch;          // NOTE(graph): the bucket's padded batch, padded rows have length 0
  a.max_seq_len = p.launch_len;  // NOTE(graph): sizes the grid; >= band_hi of every bucket replaying it
  a.block_table_stride = cfg.max_blocks_per_seq;
  a.num_blocks = cfg.num_blocks;
  a.q_stride = q_stride;
  a.out_stride = out_stride;
  a.q = q;
  a.out = out;
  a.k_cache = layers[layer].k_cache;
  a.v_cache = layers[layer].v_cache;
  a.block_tables = block_tables;
  a.seq_lens = seq_lens;
  a.alibi_slopes = alibi;
  a.bad_block = bad_block;  // NOTE(graph): fixed address; ids are clamped, the first bad one reported
  if (p.kernel == KernelKind::kV1)
    backend->attention_v1(a);
  else
    backend->attention_v2(a, p.partition_size, workspace, workspace_bytes);
}

void StepContext::enqueue_host(std::function<void()> fn) {
  if (impl_->ex->backend->kind() != BackendKind::kHost)
    throw_invalid("StepContext::enqueue_host backend", to_string(impl_->ex->backend->kind()),
                  "host (on cuda, launch your work on stream())");
  impl_->ex->backend->host_work(std::move(fn));
}

// ---------------------------------------------------------------- construction

Executor::Executor(ExecutorConfig config, StepBody body) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.log = dg_logger();
  if (!config.log_level.empty()) {
    const auto level = parse_level(config.log_level);
    if (!level) throw_invalid("log_level", config.log_level, kLevelNames);
    m.log->set_level(*level);
  } else if (const char* env = std::getenv("DECODEGRAPH_LOG_LEVEL"); env && *env) {
    const auto level = parse_level(env);
    m.log->set_level(level.value_or(spdlog::level::warn));
    if (!level) warn_bad_env_level(*m.log, env);
  } else {
    m.log->set_level(spdlog::level::warn);
  }

  BackendKind kind = config.backend;
  if (kind == BackendKind::kAuto) kind = cuda_device_available() ? BackendKind::kCuda : BackendKind::kHost;
  if (kind == BackendKind::kCuda) {
#if DECODEGRAPH_HAS_CUDA
    require(cuda_device_available(), "backend", "cuda",
            "host or auto (no usable CUDA device is present)");
    m.backend = detail::make_cuda_backend();
#else
    throw_invalid("backend", "cuda", "host or auto (this build has no CUDA)");
#endif
  } else if (kind == BackendKind::kHost) {
    m.backend = detail::make_host_backend();
  } else {
    throw_invalid("backend", static_cast<int>(config.backend), "auto, cuda or host");
  }

  // The device model is queried here, once, outside any capture.
  m.cfg = detail::resolve_config(std::move(config),
                                 [&](const AttentionSpec& spec) { return m.backend->device_model(spec); });
  m.cfg.backend = kind;
  m.check_device_ranges(m.cfg.layers);
  // Band choice: the probe runs once here, outside any capture; a missing feature is a fallback.
  m.band_mode = m.cfg.band_select;
  if (m.band_mode == BandSelect::kDevice) {
    std::string why;
    bool ok = false;
    if (m.cfg.switch_probe) {
      ok = m.cfg.switch_probe();
      if (!ok) why = "the switch_probe hook reported no conditional SWITCH nodes";
    } else {
      ok = m.backend->switch_supported(why);
    }
    if (!ok) {
      m.band_mode = BandSelect::kHost;
      m.band_note = "kDevice unsupported (" + why + "); using kHost";
      m.log->warn("band_select: conditional SWITCH nodes are not available ({}); falling back to kHost: the "
                  "band is chosen on the host each step, one graph per distinct plan",
                  why);
    }
  }
  m.body = std::move(body);
  m.plans = detail::make_plans(m.cfg);
  m.num_bands = static_cast<int>(m.cfg.band_edges.size());
  m.bucket_of_batch.assign(m.cfg.max_batch + 1, 0);
  for (int n = 1, b = 0; n <= m.cfg.max_batch; ++n) {
    while (m.cfg.batch_buckets[b] < n) ++b;
    m.bucket_of_batch[n] = b;
  }
  for (std::size_t i = 0; i < m.plans.size(); ++i)
    if (m.plans[i].graph_id >= 0) m.join(i);  // kMeasured joins a bucket once it is measured
  if (m.band_mode == BandSelect::kDevice) {
    for (int b = 0; b < static_cast<int>(m.cfg.batch_buckets.size()); ++b) {
      Impl::GraphSlot g;
      g.switch_bucket = b;
      g.plan = m.bucket_graph_plan(b);
      for (int band = 0; band < m.num_bands; ++band)
        g.buckets.push_back(static_cast<std::size_t>(b) * m.num_bands + band);
      g.stats.graph_id = b;
      g.stats.batch = g.plan.batch;
      g.stats.band = 0;
      g.stats.last_band = m.num_bands - 1;
      g.stats.buckets = m.num_bands;
      g.stats.switch_graph = true;
      m.bucket_slots.push_back(std::move(g));
    }
  }
  // One workspace for every plan, and every candidate kMeasured may time.
  for (const BucketPlan& p : m.plans) {
    m.workspace_bytes = std::max(m.workspace_bytes, p.workspace_bytes);
    for (const PlanCandidate& cand : p.candidates)
      if (cand.kernel == KernelKind::kV2)
        m.workspace_bytes =
            std::max(m.workspace_bytes, v2_workspace_size(m.cfg.spec, p.batch, p.band_hi, cand.partition_size));
  }

  // Memory: sizes first, so the budget is checked before anything is allocated.
  const ExecutorConfig& c = m.cfg;
  const std::size_t mb = static_cast<std::size_t>(c.max_batch);
  const std::size_t seq_bytes = mb * sizeof(int32_t);
  const std::size_t bt_bytes = mb * c.max_blocks_per_seq * sizeof(int32_t);
  const std::size_t slot_bytes = mb * sizeof(int64_t);
  const std::size_t alibi_bytes = c.alibi_slopes.size() * sizeof(float);
  m.owned_layers.resize(c.num_layers);
  const std::size_t layer_bytes = m.owned_bytes_missing(c.layers);
  const std::size_t measure_bytes = c.policy == KernelPolicy::kMeasured ? m.q_bytes() : 0;
  const bool on_device = m.band_mode == BandSelect::kDevice;
  const std::size_t edges_bytes = on_device ? m.num_bands * sizeof(int) : 0;
  const std::size_t counts_bytes =
      on_device ? c.batch_buckets.size() * m.num_bands * sizeof(unsigned long long) : 0;
  m.static_bytes = seq_bytes + bt_bytes + slot_bytes + alibi_bytes + sizeof(int) + measure_bytes + edges_bytes +
                   counts_bytes;
  const std::size_t needed = m.static_bytes + layer_bytes + m.workspace_bytes;
  if (c.memory_budget_bytes != 0 && needed > c.memory_budget_bytes)
    throw_invalid("memory_budget_bytes", c.memory_budget_bytes,
                  ">= " + std::to_string(needed) + " bytes needed (static buffers " +
                      std::to_string(m.static_bytes + layer_bytes) + " + V2 workspace " +
                      std::to_string(m.workspace_bytes) + "), or 0 for unlimited");

  // Allocation: any failure unwinds through Owned, so nothing leaks.
  m.seq_lens = static_cast<int32_t*>(m.alloc(seq_bytes));
  m.block_tables = static_cast<int32_t*>(m.alloc(bt_bytes));
  m.slot_mapping = static_cast<int64_t*>(m.alloc(slot_bytes));
  m.bad_block = static_cast<int*>(m.alloc(sizeof(int)));
  if (m.workspace_bytes) m.workspace = m.alloc(m.workspace_bytes);
  if (measure_bytes) m.measure_out = m.alloc(measure_bytes);
  if (on_device) {
    m.edges_dev = static_cast<int*>(m.alloc(edges_bytes));
    m.backend->upload(m.edges_dev, c.band_edges.data(), edges_bytes);
    m.branch_counts = static_cast<unsigned long long*>(m.alloc(counts_bytes));  // zeroed
  }
  if (alibi_bytes) {
    m.alibi = static_cast<float*>(m.alloc(alibi_bytes));
    m.backend->upload(m.alibi, c.alibi_slopes.data(), alibi_bytes);
  }
  m.layers = m.resolve_layers(c.layers);  // adds the owned layer buffers to static_bytes
  m.seq_lens_h = static_cast<int32_t*>(m.alloc_host(seq_bytes));
  m.block_tables_h = static_cast<int32_t*>(m.alloc_host(bt_bytes));
  m.slot_mapping_h = static_cast<int64_t*>(m.alloc_host(slot_bytes));
  m.bad_block_h = static_cast<int*>(m.alloc_host(sizeof(int)));
  *m.bad_block_h = 0;  // cudaMallocHost does not zero; the device flag starts at 0 (alloc zeroes)
  m.seq_scratch.resize(mb);
  m.slot_scratch.resize(mb);

  m.log->info("executor: backend {}, {} layers, max_batch {}, max_seq_len {}, {} buckets x {} bands, "
              "policy {}, band select {}, device model {} SMs x {} blocks, {} graphs ({} distinct plans), "
              "capture {}, memory {} (static {}, workspace {})",
              to_string(kind), c.num_layers, c.max_batch, c.max_seq_len, c.batch_buckets.size(),
              m.num_bands, to_string(c.policy), to_string(m.band_mode), c.device_model.num_sms,
              c.device_model.blocks_per_sm, on_device ? m.bucket_slots.size() : m.slots.size(), m.slots.size(),
              to_string(c.capture), mib(needed), mib(m.static_bytes),
              mib(m.workspace_bytes));
  if (m.log->should_log(spdlog::level::debug)) m.log->debug("plans:\n{}", format_plan_table(m.plans));

  if (c.capture == CapturePolicy::kUpFront) capture_all();
}

Executor::~Executor() = default;
Executor::Executor(Executor&&) noexcept = default;
Executor& Executor::operator=(Executor&&) noexcept = default;

// ---------------------------------------------------------------- step

// Checks the inputs and returns the length the band and the staged table width come from: the
// max_seq_len hint when given, else the largest seq_len. Host inputs: every length is checked (and
// against the hint). Device-resident inputs (MemorySpace::kDevice): without a hint seq_lens are
// copied to the host (num_seqs * 4 bytes, a synchronous copy on the step's stream) to find the
// band; with one nothing is read back under kCheap. Under BandSelect::kDevice the graph finds the
// band, so device inputs are never read back under kCheap, hint or not. kFull copies and checks
// everything: lengths (against the hint too), every block id a length uses, and every slot (range,
// and the position seq_len - 1 of its sequence).
Executor::Impl::Lengths Executor::Impl::validate(const StepInputs& in) {
  if (in.num_seqs < 1 || in.num_seqs > cfg.max_batch)
    throw_invalid("inputs.num_seqs", in.num_seqs, "1..max_batch = 1.." + std::to_string(cfg.max_batch));
  if (in.space != MemorySpace::kHost && in.space != MemorySpace::kDevice)
    throw_invalid("inputs.space", static_cast<int>(in.space), "kHost or kDevice");
  if (!in.seq_lens) throw_invalid("inputs.seq_lens", "null", "a pointer to num_seqs lengths");
  if (!in.block_tables) throw_invalid("inputs.block_tables", "null", "a pointer to num_seqs block-table rows");
  if (!in.slot_mapping && cfg.append_kv)
    throw_invalid("inputs.slot_mapping", "null", "a pointer to num_seqs slots (append_kv is on)");
  if (in.max_seq_len < 0 || in.max_seq_len > cfg.max_seq_len)
    throw_invalid("inputs.max_seq_len", in.max_seq_len,
                  "0 (no hint) or 1..max_seq_len = 1.." + std::to_string(cfg.max_seq_len));
  check_staging_pointers(in);
  const int n = in.num_seqs;
  const int hint = in.max_seq_len;
  const bool device = in.space == MemorySpace::kDevice;
  const bool full = cfg.validation == ValidationLevel::kFull;

  // Lengths: read unless they are on the device, a hint gives the band and kCheap trusts them.
  const bool read_lens = !device || (hint == 0 && band_mode == BandSelect::kHost) || full;
  const int32_t* lens = in.seq_lens;
  int max_len = 0;
  if (read_lens) {
    if (device) {
      backend->download(seq_scratch.data(), in.seq_lens, n * sizeof(int32_t), in.space);
      ++input_downloads;
      lens = seq_scratch.data();
    }
    for (int i = 0; i < n; ++i) {
      const int len = lens[i];
      if (len < 1 || len > cfg.max_seq_len)
        throw_invalid("inputs.seq_lens[" + std::to_string(i) + "]", len,
                      "1..max_seq_len = 1.." + std::to_string(cfg.max_seq_len));
      max_len = std::max(max_len, len);
    }
    if (hint != 0 && max_len > hint) {
      const int i = static_cast<int>(std::find(lens, lens + n, max_len) - lens);
      throw_invalid("inputs.max_seq_len", hint,
                    ">= every seq_len (seq_lens[" + std::to_string(i) + "] = " + std::to_string(max_len) +
                        "), or 0 for no hint");
    }
  }
  const int band_len = hint != 0 ? hint : max_len;
  const Lengths out{band_len, max_len};
  const int bs = cfg.spec.block_size;
  if (band_len == 0 && in.block_table_stride < 1)  // lengths unknown here (kDevice, device inputs)
    throw_invalid("inputs.block_table_stride", in.block_table_stride, ">= 1");
  const int need_cols = (band_len + bs - 1) / bs;
  if (in.block_table_stride < need_cols)
    throw_invalid("inputs.block_table_stride", in.block_table_stride,
                  ">= ceil(" + std::string(hint != 0 ? "max_seq_len hint " : "max seq_len ") +
                      std::to_string(band_len) + " / block_size " + std::to_string(bs) + ") = " +
                      std::to_string(need_cols));
  if (!full) return out;

  const int32_t* bt = in.block_tables;
  const int64_t* slots = in.slot_mapping;
  if (device) {
    const std::size_t entries = static_cast<std::size_t>(n) * in.block_table_stride;
    if (bt_scratch.size() < entries) bt_scratch.resize(entries);  // grows once per new maximum
    backend->download(bt_scratch.data(), in.block_tables, entries * sizeof(int32_t), in.space);
    ++input_downloads;
    bt = bt_scratch.data();
    if (slots) {
      backend->download(slot_scratch.data(), in.slot_mapping, n * sizeof(int64_t), in.space);
      ++input_downloads;
      slots = slot_scratch.data();
    }
  }
  for (int i = 0; i < n; ++i) {
    const int used = (lens[i] + bs - 1) / bs;
    const int32_t* row = bt + static_cast<std::size_t>(i) * in.block_table_stride;
    for (int j = 0; j < used; ++j)
      if (row[j] < 0 || row[j] >= cfg.num_blocks)
        throw_invalid("inputs.block_tables[" + std::to_string(i) + "][" + std::to_string(j) + "]",
                      row[j], "0..num_blocks-1 = 0.." + std::to_string(cfg.num_blocks - 1));
  }
  if (slots) {
    const int64_t cap = static_cast<int64_t>(cfg.num_blocks) * bs;
    for (int i = 0; i < n; ++i)
      if (slots[i] >= cap)
        throw_invalid("inputs.slot_mapping[" + std::to_string(i) + "]", slots[i],
                      "negative (skip) or 0..num_blocks*block_size-1 = 0.." + std::to_string(cap - 1));
    // seq_lens includes this step's token, so its slot is that of position seq_len - 1. A slot of
    // position seq_len (lengths counted before the append) is the classic off-by-one: the attention
    // would read a stale token at seq_len - 1 and the new one would land past the length.
    for (int i = 0; i < n; ++i) {
      if (slots[i] < 0) continue;
      const int pos = lens[i] - 1;
      const int col = pos / bs;
      const int64_t block = bt[static_cast<std::size_t>(i) * in.block_table_stride + col];
      const int64_t want = block * bs + pos % bs;
      if (slots[i] != want)
        throw_invalid("inputs.slot_mapping[" + std::to_string(i) + "]", slots[i],
                      "negative (skip) or the slot of position seq_len - 1 = " + std::to_string(pos) +
                          " (seq_lens counts the token appended this step): block_tables[" +
                          std::to_string(i) + "][" + std::to_string(col) + "] * block_size + " +
                          std::to_string(pos % bs) + " = " + std::to_string(block) + " * " +
                          std::to_string(bs) + " + " + std::to_string(pos % bs) + " = " + std::to_string(want));
    }
  }
  return out;
}

// Inputs may point at the host staging buffers (host_staging()), but only as handed out: each at its
// buffer's start, the table at its pitch, in host space. Anything else overlapping them would be
// copied onto itself.
void Executor::Impl::check_staging_pointers(const StepInputs& in) const {
  const std::size_t n = static_cast<std::size_t>(in.num_seqs);
  const std::size_t mb = static_cast<std::size_t>(cfg.max_batch);
  auto check = [&](const void* p, std::size_t bytes, const void* base, std::size_t base_bytes, const char* name) {
    if (p == base || !overlaps(p, bytes, base, base_bytes)) return;
    throw_invalid(std::string("inputs.") + name, ptr_text(p),
                  std::string("a buffer outside the host staging buffers, or exactly host_staging().") + name);
  };
  check(in.seq_lens, n * sizeof(int32_t), seq_lens_h, mb * sizeof(int32_t), "seq_lens");
  check(in.slot_mapping, n * sizeof(int64_t), slot_mapping_h, mb * sizeof(int64_t), "slot_mapping");
  const std::size_t rows = in.block_table_stride > 0 ? n * static_cast<std::size_t>(in.block_table_stride) : n;
  check(in.block_tables, rows * sizeof(int32_t), block_tables_h, mirror_table_bytes(), "block_tables");
  const bool any = in.seq_lens == seq_lens_h || in.slot_mapping == slot_mapping_h || in.block_tables == block_tables_h;
  if (any && in.space != MemorySpace::kHost)
    throw_invalid("inputs.space", "kDevice", "kHost for inputs in the host staging buffers");
  if (in.block_tables == block_tables_h && in.block_table_stride != cfg.max_blocks_per_seq)
    throw_invalid("inputs.block_table_stride", in.block_table_stride,
                  "host_staging().block_table_stride = " + std::to_string(cfg.max_blocks_per_seq) +
                      " for block_tables in the host staging buffer");
}

// Copies the inputs into the static buffers for bucket `plan`. Rows [num_seqs, batch) get seq_len 0
// and slot -1. Only the block-table columns band_len needs are copied: the kernels never read past
// a row's length, clamped to the band. Host inputs go through the pinned mirrors, unless they were
// written there already (host_staging()): then only the DMA remains.
void Executor::Impl::stage(const StepInputs& in, const BucketPlan& plan, int band_len) {
  const int n = in.num_seqs;
  const int pad = plan.batch - n;
  const int slots = in.slot_mapping ? n : 0;  // rows [slots, batch) get slot -1
  // band_len 0: the lengths were not read (kDevice, device inputs): every column the row may use.
  const std::size_t cols =
      band_len > 0 ? static_cast<std::size_t>((band_len + cfg.spec.block_size - 1) / cfg.spec.block_size)
                   : static_cast<std::size_t>(std::min(in.block_table_stride, cfg.max_blocks_per_seq));
  const std::size_t dpitch = static_cast<std::size_t>(cfg.max_blocks_per_seq) * sizeof(int32_t);
  const std::size_t spitch = static_cast<std::size_t>(in.block_table_stride) * sizeof(int32_t);
  backend->wait_staging_reusable();
  if (in.space == MemorySpace::kHost) {
    const std::size_t width = cols * sizeof(int32_t);
    if (in.seq_lens != seq_lens_h) {
      std::memcpy(seq_lens_h, in.seq_lens, n * sizeof(int32_t));
      staging_copy_bytes += n * sizeof(int32_t);
    }
    std::fill(seq_lens_h + n, seq_lens_h + plan.batch, 0);
    if (slots && in.slot_mapping != slot_mapping_h) {
      std::memcpy(slot_mapping_h, in.slot_mapping, slots * sizeof(int64_t));
      staging_copy_bytes += slots * sizeof(int64_t);
    }
    std::fill(slot_mapping_h + slots, slot_mapping_h + plan.batch, int64_t{-1});
    if (in.block_tables != block_tables_h) {
      for (int i = 0; i < n; ++i)
        std::memcpy(reinterpret_cast<char*>(block_tables_h) + i * dpitch,
                    reinterpret_cast<const char*>(in.block_tables) + i * spitch, width);
      staging_copy_bytes += static_cast<long long>(n) * width;
    }
    backend->stage_2d(seq_lens, 0, seq_lens_h, 0, plan.batch * sizeof(int32_t), 1, MemorySpace::kHost);
    backend->stage_2d(slot_mapping, 0, slot_mapping_h, 0, plan.batch * sizeof(int64_t), 1, MemorySpace::kHost);
    backend->stage_2d(block_tables, dpitch, block_tables_h, dpitch, width, n, MemorySpace::kHost);
  } else {
    backend->stage_2d(seq_lens, 0, in.seq_lens, 0, n * sizeof(int32_t), 1, in.space);
    if (pad) backend->stage_fill(seq_lens + n, 0, pad * sizeof(int32_t));
    if (slots) backend->stage_2d(slot_mapping, 0, in.slot_mapping, 0, slots * sizeof(int64_t), 1, in.space);
    if (slots < plan.batch)
      backend->stage_fill(slot_mapping + slots, 0xff, (plan.batch - slots) * sizeof(int64_t));  // -1
    backend->stage_2d(block_tables, dpitch, in.block_tables, spitch, cols * sizeof(int32_t), n, in.space);
  }
  backend->staging_done();
}

// Fills the staged buffers with a step of plan.batch sequences in the middle of the plan's band,
// each over valid block ids, and no slots: what kMeasured times where no real step is staged for
// the band (CapturePolicy::kUpFront; every band of a kDevice bucket). Only executor buffers change,
// and the pinned host mirrors are put back as they were: they may hold the caller's inputs for the
// step being run, written through host_staging(), which stage() then does not copy again.
void Executor::Impl::stage_synthetic(const BucketPlan& plan) {
  const std::size_t mb = static_cast<std::size_t>(cfg.max_batch);
  const std::vector<int32_t> lens_kept(seq_lens_h, seq_lens_h + mb);
  const std::vector<int64_t> slots_kept(slot_mapping_h, slot_mapping_h + mb);
  const std::vector<int32_t> tables_kept(block_tables_h, block_tables_h + mb * cfg.max_blocks_per_seq);
  struct Restore {  // on every path: a failed staging copy must not leave synthetic inputs behind
    Impl& m;
    const std::vector<int32_t>& lens;
    const std::vector<int64_t>& slots;
    const std::vector<int32_t>& tables;
    ~Restore() {
      try {
        m.backend->wait_staging_reusable();  // the synthetic copies have read the mirrors
      } catch (...) {
      }
      std::copy(lens.begin(), lens.end(), m.seq_lens_h);
      std::copy(slots.begin(), slots.end(), m.slot_mapping_h);
      std::copy(tables.begin(), tables.end(), m.block_tables_h);
    }
  } restore{*this, lens_kept, slots_kept, tables_kept};
  stage_synthetic_rows(plan);
}

void Executor::Impl::stage_synthetic_rows(const BucketPlan& plan) {
  const int len = plan.band_lo + (plan.band_hi - plan.band_lo + 1) / 2;
  const int cols = (len + cfg.spec.block_size - 1) / cfg.spec.block_size;
  std::vector<int32_t> lens(plan.batch, len), tables(static_cast<std::size_t>(plan.batch) * cols);
  for (std::size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i % cfg.num_blocks);
  StepInputs in;
  in.num_seqs = plan.batch;
  in.seq_lens = lens.data();
  in.block_tables = tables.data();
  in.block_table_stride = cols;
  const long long copied = staging_copy_bytes;  // not a step's copy
  stage(in, plan, len);
  staging_copy_bytes = copied;
}

// Assigns bucket `idx` to the graph of its launch, making a new one the first time a launch is seen.
// Band fields of the graph's plan span its buckets (StepContext::plan).
void Executor::Impl::join(std::size_t idx) {
  BucketPlan& p = plans[idx];
  const auto [it, fresh] = slot_of_launch.emplace(detail::launch_key(p), static_cast<int>(slots.size()));
  if (fresh) {
    GraphSlot g;
    g.plan = p;
    g.plan.graph_id = it->second;
    g.plan.candidates.clear();
    g.stats.graph_id = it->second;
    g.stats.batch = p.batch;
    g.stats.band = g.stats.last_band = p.band;
    g.stats.kernel = p.kernel;
    g.stats.partition_size = p.partition_size;
    slots.push_back(std::move(g));
  }
  GraphSlot& g = slots[it->second];
  g.buckets.push_back(idx);
  g.plan.band = std::min(g.plan.band, p.band);
  g.plan.band_lo = std::min(g.plan.band_lo, p.band_lo);
  g.plan.band_hi = std::max(g.plan.band_hi, p.band_hi);
  g.stats.band = g.plan.band;
  g.stats.last_band = std::max(g.stats.last_band, p.band);
  g.stats.buckets = static_cast<int>(g.buckets.size());
  p.graph_id = it->second;
}

// kMeasured: captures a graph of every layer's attention for each candidate of bucket `idx` (no KV
// append, no step body: nothing but executor memory is written, the output going to measure_out),
// replays it on the staged inputs (one warm-up, then measure_replays timed replays), keeps the fastest
// and joins the bucket to its graph. Runs outside any capture, before the bucket's real graph is
// captured; bounded by 4 candidates x (1 + measure_replays) replays. On any exception the bucket
// stays unmeasured (the candidate graphs are discarded) and the next step measures it again.
void Executor::Impl::measure(std::size_t idx) {
  detail::NvtxRange range("decodegraph::measure");
  const auto t0 = std::chrono::steady_clock::now();
  BucketPlan& plan = plans[idx];
  std::vector<PlanCandidate> cands = plan.candidates;
  std::size_t best = 0;
  for (std::size_t k = 0; k < cands.size(); ++k) {
    BucketPlan trial = plan;
    detail::set_launch(trial, cfg, cands[k].kernel, cands[k].partition_size);
    backend->begin_capture();
    AbortCapture abort{backend.get()};
    for (int l = 0; l < cfg.num_layers; ++l) attention(trial, l, layers[l].q, measure_out, layers[l].q_stride, 0);
    abort.armed = false;
    std::unique_ptr<BackendGraph> g = backend->end_capture_and_instantiate();
    ++candidate_graphs;
    const double us = backend->time_replays(*g, cfg.measure_replays);
    cands[k].us = cfg.measure_clock ? cfg.measure_clock(plan, cands[k]) : us;
    if (cands[k].us < cands[best].us) best = k;  // ties keep the earlier: V1, then kAuto's P
  }
  detail::set_launch(plan, cfg, cands[best].kernel, cands[best].partition_size);
  plan.candidates = std::move(cands);
  plan.reason = PlanReason::kMeasuredFastest;
  join(idx);
  const double ms = ms_since(t0);
  slots[plan.graph_id].stats.measure_ms += ms;
  measure_ms += ms;
  ++measured_buckets;
  log->info("measured bucket batch {} band {} ({},{}] in {:.3f} ms: {}", plan.batch, plan.band, plan.band_lo,
            plan.band_hi, ms, describe_reason(plan));
}

// Captures and instantiates the graph that bucket `idx` replays (shared with every bucket of the
// same launch). On any exception the capture is ended and discarded (no partial graph), and the
// graph stays uncaptured.
void Executor::Impl::capture(std::size_t idx) {
  capture_slot(slots[plans[idx].graph_id], "bucket (batch " + std::to_string(plans[idx].batch) + ", band " +
                                               std::to_string(plans[idx].band) + ", graph " +
                                               std::to_string(plans[idx].graph_id) + ")");
}

// Captures and instantiates `slot`'s graph; `what` names it in a budget error.
void Executor::Impl::capture_slot(GraphSlot& slot, const std::string& what) {
  if (slot.rejected_bytes != 0) check_graph_budget(what, slot.rejected_bytes);  // throws
  detail::NvtxRange range("decodegraph::capture");
  if (slot.switch_bucket >= 0) slot.plan = bucket_graph_plan(slot.switch_bucket);  // kMeasured may have moved it
  const BucketPlan& plan = slot.plan;
  const auto t0 = std::chrono::steady_clock::now();
  backend->begin_capture();
  AbortCapture abort{backend.get()};
  record_slot(slot);
  const double capture_ms = ms_since(t0);
  abort.armed = false;  // end_capture_and_instantiate ends the capture on every path
  const auto t1 = std::chrono::steady_clock::now();
  std::unique_ptr<BackendGraph> g = backend->end_capture_and_instantiate();
  const double inst_ms = ms_since(t1);
  try {
    check_graph_budget(what, g->bytes());
  } catch (const Error&) {
    slot.rejected_bytes = g->bytes();
    throw;
  }
  GraphStats& s = slot.stats;
  s.captures += 1;
  s.nodes = g->nodes();
  s.bytes = g->bytes();
  s.capture_ms = capture_ms;
  s.instantiate_ms = inst_ms;
  slot.graph = std::move(g);
  ++total_captures;
  log->info("captured {}graph {} for batch {} lengths ({},{}] {} ({} buckets): {} nodes, capture {:.3f} ms, "
            "instantiate {:.3f} ms, graph memory {}",
            slot.switch_bucket >= 0 ? "SWITCH " : "", s.graph_id, plan.batch, plan.band_lo, plan.band_hi,
            slot.switch_bucket >= 0 ? "every band" : to_string(plan.kernel), slot.buckets.size(), s.nodes,
            capture_ms, inst_ms, mib(s.bytes));
}

// Records one graph's work into the running capture: the step body (or every layer's append and
// attention), then the copy of the bad-block flag to the host. NOTE(graph): the copy comes last, in
// stream order after every launch that may set the flag.
void Executor::Impl::record(const BucketPlan& plan, int switch_bucket) {
  StepContext::Impl ctx_impl{this, &plan, switch_bucket};
  StepContext ctx(&ctx_impl);
  if (body) {
    body(ctx);
  } else {
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (cfg.append_kv) ctx.append_kv(l);
      ctx.attention(l);
    }
  }
  backend->copy_to_host(bad_block_h, bad_block, sizeof(int));
}

void Executor::Impl::record_slot(GraphSlot& slot) {
  if (slot.switch_bucket >= 0)
    record_switch(slot);
  else
    record(slot.plan);
}

// kDevice: the band-select node first (after staging, before any attention), then the step body
// with every attention call a SWITCH node (attention_switch) and the flag copy: record() with the bucket.
void Executor::Impl::record_switch(GraphSlot& slot) {
  const int b = slot.switch_bucket;
  kernels::BandSelectParams p;
  p.seq_lens = seq_lens;  // NOTE(graph): staged each step; padded rows are 0
  p.batch = slot.plan.batch;
  p.edges = edges_dev;
  p.num_edges = num_bands;
  p.branch_counts = branch_counts + static_cast<std::size_t>(b) * num_bands;
  backend->band_select(p);
  switch_nodes = 0;
  record(slot.plan, b);
}

// What StepContext::plan() says while a kDevice bucket graph is recorded: the bucket's batch, every
// band (band 0 .. the last, lengths (0, max_seq_len]), the longest launch_len and largest workspace
// of its branches, and the longest band's kernel and partitions.
BucketPlan Executor::Impl::bucket_graph_plan(int bucket) const {
  const std::size_t first = static_cast<std::size_t>(bucket) * num_bands;
  BucketPlan p = plans[first + num_bands - 1];
  p.candidates.clear();
  p.band = 0;
  p.band_lo = 0;
  p.graph_id = bucket;
  for (int band = 0; band < num_bands; ++band) {
    p.launch_len = std::max(p.launch_len, plans[first + band].launch_len);
    p.workspace_bytes = std::max(p.workspace_bytes, plans[first + band].workspace_bytes);
  }
  return p;
}

bool Executor::Impl::bucket_measured(int bucket) const {
  for (int band = 0; band < num_bands; ++band)
    if (plans[static_cast<std::size_t>(bucket) * num_bands + band].graph_id < 0) return false;
  return true;
}

// kMeasured under kDevice: a bucket graph holds every band, so every band not yet measured is
// measured now, each on synthetic inputs in its band (stage_synthetic); the caller restages.
void Executor::Impl::measure_bucket(int bucket) {
  for (int band = 0; band < num_bands; ++band) {
    const std::size_t idx = static_cast<std::size_t>(bucket) * num_bands + band;
    if (plans[idx].graph_id >= 0) continue;
    stage_synthetic(plans[idx]);
    measure(idx);
  }
}

// Static buffers and workspace are checked against memory_budget_bytes at construction; graph
// memory is known only once a bucket is captured, so it is checked here, before the graph is kept.
// With CapturePolicy::kUpFront an over-budget bucket therefore fails construction; with kLazy the
// step that first needs it throws. Executor memory only grows (graphs are never freed), so a
// rejected bucket can never fit later: capture() remembers it and throws the same error at once,
// without capturing it again.
void Executor::Impl::check_graph_budget(const std::string& what, std::size_t bytes) const {
  if (cfg.memory_budget_bytes == 0) return;
  const std::size_t total = static_bytes + workspace_bytes + graph_bytes() + bytes;
  if (total > cfg.memory_budget_bytes)
    throw_invalid("memory_budget_bytes", cfg.memory_budget_bytes,
                  ">= " + std::to_string(total) + " bytes to hold the graph of " + what + ", or 0 for unlimited");
}

StepResult Executor::step(const StepInputs& inputs) { return impl_->step(inputs, std::nullopt); }

StepResult Executor::step(const StepInputs& inputs, Stream stream) { return impl_->step(inputs, stream); }

StepResult Executor::Impl::step(const StepInputs& inputs, std::optional<Stream> stream) {
  detail::NvtxRange range("decodegraph::step");
  StepResult r;
  try {
    report_bad_block(/*wait=*/false);
    EndStep end{backend.get()};
    backend->begin_step(stream);
    const Lengths lens = validate(inputs);
    const int band_len = lens.band_len;
    const int bucket = bucket_of_batch[inputs.num_seqs];
    const auto& e = cfg.band_edges;
    if (band_mode == BandSelect::kDevice) {
      // NOTE(graph): the bucket's graph reads the band off the staged lengths when it runs.
      GraphSlot& slot = bucket_slots[bucket];
      const BucketPlan& first = plans[static_cast<std::size_t>(bucket) * num_bands];
      stage(inputs, first, band_len);
      if (!bucket_measured(bucket)) {  // kMeasured: every band's candidates, on synthetic inputs
        measure_bucket(bucket);
        stage(inputs, first, band_len);  // this step's inputs again
        r.measured = true;
      }
      if (!slot.graph) {
        capture_slot(slot, "batch bucket " + std::to_string(bucket) + " (batch " + std::to_string(first.batch) +
                               ", every band; BandSelect::kDevice)");
        r.captured = true;
      }
      backend->launch(*slot.graph);
      ++slot.stats.replays;
      r.bucket = BucketIndex(bucket);
      r.bucket_batch_size = first.batch;
      r.band_on_device = true;
      r.graph_id = bucket;
      r.band = -1;
      if (lens.max_len > 0) {  // the same choice the graph makes, from the same function
        const int band = kernels::select_band(lens.max_len, e.data(), num_bands);
        const BucketPlan& p = plans[static_cast<std::size_t>(bucket) * num_bands + band];
        r.band = band;
        r.band_hi = p.band_hi;
        r.kernel = p.kernel;
        r.partition_size = p.partition_size;
      }
    } else {
    const int band = static_cast<int>(std::lower_bound(e.begin(), e.end(), band_len) - e.begin());
    const std::size_t idx = static_cast<std::size_t>(bucket) * num_bands + band;
    const BucketPlan& plan = plans[idx];
    stage(inputs, plan, band_len);
    if (plan.graph_id < 0) {  // kMeasured: time the candidates on this step's staged inputs
      measure(idx);
      r.measured = true;
    }
    GraphSlot& slot = slots[plan.graph_id];
    if (!slot.graph) {
      capture(idx);
      r.captured = true;
    }
    backend->launch(*slot.graph);
    ++slot.stats.replays;
    r.bucket = BucketIndex(bucket);
    r.bucket_batch_size = plan.batch;
    r.band = plan.band;
    r.band_hi = plan.band_hi;
    r.kernel = plan.kernel;
    r.partition_size = plan.partition_size;
    r.graph_id = plan.graph_id;
    }
  } catch (...) {
    ++rejected;
    throw;
  }
  ++steps;
  if (log->should_log(spdlog::level::trace))
    log->trace("step {}: num_seqs {} -> batch {} band {} ({}, graph {}){}{}", steps, inputs.num_seqs,
               r.bucket_batch_size, r.band, to_string(r.kernel), r.graph_id, r.measured ? ", measured" : "",
               r.captured ? ", captured" : "");
  return r;
}

// The flag the graphs copy to bad_block_h is read without a CUDA call: a 4-byte aligned DMA write
// is seen whole or not at all, and the flag only goes from 0 to a reported entry until it is reset
// here. Resetting waits for the last step first, so no graph still in flight can copy the old
// value back afterwards.
void Executor::Impl::report_bad_block(bool wait) {
  if (wait) backend->wait_last_step();
  if (*static_cast<volatile int*>(bad_block_h) == 0) {
    if (wait) reported_through = steps;
    return;
  }
  if (!wait) backend->wait_last_step();
  const int v = *static_cast<volatile int*>(bad_block_h);
  const int zero = 0;
  backend->upload(bad_block, &zero, sizeof zero);
  *static_cast<volatile int*>(bad_block_h) = 0;
  ++bad_block_reports;
  const long long from = reported_through + 1;
  reported_through = steps;
  const std::string when = from == steps ? "step " + std::to_string(steps)
                                         : "one of steps " + std::to_string(from) + ".." + std::to_string(steps) +
                                               ", those since the last report";
  std::string entry = "inputs.block_tables (an entry past index INT_MAX)";
  std::string seq = "one sequence";
  if (v != INT_MAX) {
    const int flat = v - 1;
    const int stride = cfg.max_blocks_per_seq;
    entry = "inputs.block_tables[" + std::to_string(flat / stride) + "][" + std::to_string(flat % stride) + "]";
    seq = "sequence " + std::to_string(flat / stride);
  }
  throw InvalidArgument(entry + " = (value not recorded) is invalid; allowed: 0..num_blocks-1 = 0.." +
                        std::to_string(cfg.num_blocks - 1) + ". A previous step (" + when +
                        ") read this block id: ValidationLevel::kCheap leaves block ids to "
                        "the caller, and the kernels clamped it into the cache, so that step's output for " + seq +
                        " is wrong. Reported once; the executor is usable and the next step runs.");
}

void Executor::check_errors() { impl_->report_bad_block(/*wait=*/true); }

HostStaging Executor::host_staging() {
  Impl& m = *impl_;
  m.backend->wait_staging_reusable();
  const std::size_t mb = static_cast<std::size_t>(m.cfg.max_batch);
  HostStaging h;
  h.seq_lens = std::span<int32_t>(m.seq_lens_h, mb);
  h.block_tables = std::span<int32_t>(m.block_tables_h, mb * m.cfg.max_blocks_per_seq);
  h.block_table_stride = m.cfg.max_blocks_per_seq;
  h.slot_mapping = std::span<int64_t>(m.slot_mapping_h, mb);
  return h;
}

// ---------------------------------------------------------------- layers and rebinding

// What the CUDA driver says about each caller buffer's allocation (the host backend knows nothing
// and checks only the sizes given in LayerBuffers, in check_layer_buffers).
void Executor::Impl::check_device_ranges(const std::vector<LayerBuffers>& given) const {
  const std::size_t esize = dtype_size(cfg.spec.dtype);
  const std::size_t need_cache = detail::cache_bytes_needed(cfg);
  const std::size_t block_bytes = cfg.spec.block_elems() * esize;
  const int64_t q_row = static_cast<int64_t>(cfg.spec.num_q_heads) * cfg.spec.head_size;
  const int64_t kv_row = static_cast<int64_t>(cfg.spec.num_kv_heads) * cfg.spec.head_size;
  // Rows of a strided buffer: the last one starts (max_batch - 1) strides in.
  auto rows_bytes = [&](int64_t stride, int64_t row) {
    const int64_t s = stride != 0 ? stride : row;
    return static_cast<std::size_t>((cfg.max_batch - 1) * s + row) * esize;
  };
  for (int l = 0; l < cfg.num_layers; ++l) {
    const LayerBuffers& lb = given[l];
    const std::string p = "layers[" + std::to_string(l) + "].";
    auto check = [&](const void* ptr, const char* name, std::size_t need, const std::string& need_text) {
      if (ptr == nullptr) return;
      const detail::AddressRange r = backend->address_range(ptr);
      if (r.kind == detail::AddressRange::kHostOnly)
        throw_invalid(p + name, ptr_text(ptr), "device memory (this is host memory the GPU cannot read)");
      if (r.kind == detail::AddressRange::kDevice && r.bytes_from_ptr < need)
        throw_invalid(p + name,
                      ptr_text(ptr) + " with " + std::to_string(r.bytes_from_ptr) +
                          " bytes to the end of its allocation (cuMemGetAddressRange)",
                      need_text);
    };
    const std::string cache_text = "at least num_blocks x block bytes = " + std::to_string(cfg.num_blocks) +
                                   " x " + std::to_string(block_bytes) + " = " + std::to_string(need_cache) + " bytes";
    check(lb.k_cache, "k_cache", need_cache, cache_text);
    check(lb.v_cache, "v_cache", need_cache, cache_text);
    auto rows_text = [&](std::size_t bytes) {
      return "at least max_batch = " + std::to_string(cfg.max_batch) + " rows at its stride = " +
             std::to_string(bytes) + " bytes";
    };
    const std::size_t qb = rows_bytes(lb.q_stride, q_row), ob = rows_bytes(lb.out_stride, q_row);
    const std::size_t kb = rows_bytes(lb.new_key_stride, kv_row), vb = rows_bytes(lb.new_value_stride, kv_row);
    check(lb.q, "q", qb, rows_text(qb));
    check(lb.out, "out", ob, rows_text(ob));
    check(lb.new_key, "new_key", kb, rows_text(kb));
    check(lb.new_value, "new_value", vb, rows_text(vb));
  }
}

// Bytes of executor-owned layer buffers `given` needs that are not allocated yet.
std::size_t Executor::Impl::owned_bytes_missing(const std::vector<LayerBuffers>& given) const {
  std::size_t n = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const LayerBuffers& lb = given[l];
    const OwnedLayer& o = owned_layers[l];
    if (!lb.q && !o.q) n += q_bytes();
    if (!lb.out && !o.out) n += q_bytes();
    if (!lb.new_key && !o.new_key) n += kv_token_bytes();
    if (!lb.new_value && !o.new_value) n += kv_token_bytes();
  }
  return n;
}

// `given` with every null q/out/new K/V replaced by the layer's executor-owned buffer (allocated
// the first time it is needed; executor-owned buffers are contiguous).
std::vector<LayerBuffers> Executor::Impl::resolve_layers(const std::vector<LayerBuffers>& given) {
  std::vector<LayerBuffers> out = given;
  auto own = [&](void*& slot, void*& owned, std::size_t bytes) {
    if (slot) return;
    if (!owned) {
      owned = alloc(bytes);
      static_bytes += bytes;
    }
    slot = owned;
  };
  for (int l = 0; l < cfg.num_layers; ++l) {
    OwnedLayer& o = owned_layers[l];
    own(out[l].q, o.q, q_bytes());
    own(out[l].out, o.out, q_bytes());
    own(out[l].new_key, o.new_key, kv_token_bytes());
    own(out[l].new_value, o.new_value, kv_token_bytes());
  }
  return out;
}

void Executor::rebind_layers(std::vector<LayerBuffers> layers) {
  detail::NvtxRange range("decodegraph::rebind_layers");
  Impl& m = *impl_;
  // 1. Validation: nothing has changed when this throws.
  detail::check_layer_buffers(layers, m.cfg);
  m.check_device_ranges(layers);
  const std::size_t extra = m.owned_bytes_missing(layers);
  if (m.cfg.memory_budget_bytes != 0 && extra != 0) {
    const std::size_t total = m.static_bytes + m.workspace_bytes + m.graph_bytes() + extra;
    if (total > m.cfg.memory_budget_bytes)
      throw_invalid("memory_budget_bytes", m.cfg.memory_budget_bytes,
                    ">= " + std::to_string(total) + " bytes to own the layer buffers left null in rebind_layers, "
                    "or 0 for unlimited");
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<LayerBuffers> resolved = m.resolve_layers(layers);  // owned buffers are kept either way
  // NOTE(graph): a graph still running reads the old buffers; after this, none does.
  m.backend->wait_last_step();

  // 2. Re-capture every captured graph with the new buffers. A failure here restores the old
  //    buffers and leaves every graph as it was.
  std::vector<LayerBuffers> old = std::exchange(m.layers, std::move(resolved));
  std::vector<std::pair<Impl::GraphSlot*, std::unique_ptr<detail::CapturedGraph>>> pending;
  try {
    for (auto* list : {&m.slots, &m.bucket_slots}) {
      for (Impl::GraphSlot& slot : *list) {
        if (!slot.graph) continue;
        m.backend->begin_capture();
        AbortCapture abort{m.backend.get()};
        m.record_slot(slot);
        abort.armed = false;
        pending.emplace_back(&slot, m.backend->end_capture());
      }
    }
  } catch (...) {
    m.layers = std::move(old);
    throw;
  }

  // 3. Apply them. From here on the new buffers are in effect: a graph whose update and
  //    re-instantiation both fail is dropped (captured again when a step needs it), never kept
  //    pointing at the old buffers.
  m.cfg.layers = std::move(layers);
  std::exception_ptr first;
  int updated = 0, reinstantiated = 0, dropped = 0;
  for (auto& [slot, captured] : pending) {
    try {
      if (m.backend->update(*slot->graph, *captured)) {
        ++slot->stats.updates;
        ++updated;
      } else {
        ++slot->stats.reinstantiations;
        ++reinstantiated;
      }
      slot->stats.nodes = slot->graph->nodes();
      slot->stats.bytes = slot->graph->bytes();
    } catch (...) {
      if (!first) first = std::current_exception();
      slot->graph.reset();
      ++dropped;
    }
  }
  m.graph_updates += updated;
  m.graph_reinstantiations += reinstantiated;
  m.log->info("rebind_layers: {} graphs updated in place, {} re-instantiated, {} dropped, in {:.3f} ms", updated,
              reinstantiated, dropped, ms_since(t0));
  if (first) std::rethrow_exception(first);
  ++m.rebinds;
}

void Executor::capture_all() {
  Impl& m = *impl_;
  // kMeasured stages synthetic inputs and replays: ordered like a step on the executor's stream.
  EndStep end{m.backend.get()};
  m.backend->begin_step(std::nullopt);
  if (m.band_mode == BandSelect::kDevice) {
    for (Impl::GraphSlot& slot : m.bucket_slots) {
      const int b = slot.switch_bucket;
      if (!m.bucket_measured(b)) m.measure_bucket(b);
      if (!slot.graph)
        m.capture_slot(slot, "batch bucket " + std::to_string(b) + " (batch " + std::to_string(slot.plan.batch) +
                                 ", every band; BandSelect::kDevice)");
    }
    return;
  }
  for (std::size_t i = 0; i < m.plans.size(); ++i) {
    if (m.plans[i].graph_id < 0) {
      m.stage_synthetic(m.plans[i]);
      m.measure(i);
    }
    if (!m.slots[m.plans[i].graph_id].graph) m.capture(i);
  }
}

// ---------------------------------------------------------------- accessors

BackendKind Executor::backend() const { return impl_->backend->kind(); }
BandSelect Executor::band_select() const { return impl_->band_mode; }
const ExecutorConfig& Executor::config() const { return impl_->cfg; }
const std::vector<BucketPlan>& Executor::plans() const { return impl_->plans; }

const BucketPlan& Executor::plan_for(BucketIndex bucket, int band) const {
  const Impl& m = *impl_;
  const int nb = static_cast<int>(m.cfg.batch_buckets.size());
  if (bucket.value < 0 || bucket.value >= nb)
    throw_invalid("bucket", bucket.value,
                  "a batch bucket index 0.." + std::to_string(nb - 1) + " (not a batch size: see plan_for_batch)");
  if (band < 0 || band >= m.num_bands)
    throw_invalid("band", band, "a band index 0.." + std::to_string(m.num_bands - 1));
  return m.plans[static_cast<std::size_t>(bucket.value) * m.num_bands + band];
}

const BucketPlan& Executor::plan_for(const StepResult& step) const { return plan_for(step.bucket, step.band); }

const BucketPlan& Executor::plan_for_batch(int batch_size, int band) const {
  const Impl& m = *impl_;
  if (batch_size < 1 || batch_size > m.cfg.max_batch)
    throw_invalid("batch_size", batch_size, "1..max_batch = 1.." + std::to_string(m.cfg.max_batch));
  return plan_for(BucketIndex(m.bucket_of_batch[batch_size]), band);
}

std::string Executor::plan_table() const { return format_plan_table(impl_->plans); }

ExecutorStats Executor::stats() const {
  const Impl& m = *impl_;
  ExecutorStats s;
  for (const Impl::GraphSlot& g : m.slots) {
    if (g.stats.captures > 0) {
      GraphStats gs = g.stats;
      gs.band_lo = g.plan.band_lo;
      gs.band_hi = g.plan.band_hi;
      s.graphs.push_back(gs);
    }
    s.capture_ms += g.stats.capture_ms;
    s.instantiate_ms += g.stats.instantiate_ms;
  }
  // kDevice: the branch counters live in executor memory; one read for all buckets.
  std::vector<unsigned long long> counts;
  bool any = false;
  for (const Impl::GraphSlot& g : m.bucket_slots) any = any || g.stats.captures > 0;
  if (any) {
    counts.resize(m.bucket_slots.size() * m.num_bands);
    if (!m.backend->read_for_stats(counts.data(), m.branch_counts, counts.size() * sizeof(unsigned long long)))
      counts.clear();
  }
  for (const Impl::GraphSlot& g : m.bucket_slots) {
    s.capture_ms += g.stats.capture_ms;
    s.instantiate_ms += g.stats.instantiate_ms;
    if (g.stats.captures == 0) continue;
    GraphStats gs = g.stats;
    gs.band_lo = g.plan.band_lo;
    gs.band_hi = g.plan.band_hi;
    gs.kernel = g.plan.kernel;
    gs.partition_size = g.plan.partition_size;
    std::set<int> distinct;
    const std::size_t first = static_cast<std::size_t>(g.switch_bucket) * m.num_bands;
    for (int band = 0; band < m.num_bands; ++band) {
      const BucketPlan& p = m.plans[first + band];
      distinct.insert(p.graph_id);
      gs.band_kernels.push_back(p.kernel);
      if (!counts.empty()) gs.band_replays.push_back(static_cast<long long>(counts[first + band]));
    }
    gs.branches = static_cast<int>(distinct.size());
    s.graphs.push_back(std::move(gs));
  }
  s.band_select = m.band_mode;
  s.band_select_note = m.band_note;
  s.buckets = static_cast<int>(m.plans.size());
  s.distinct_plans = static_cast<int>(m.slots.size());
  s.distinct_graphs = m.band_mode == BandSelect::kDevice ? static_cast<int>(m.bucket_slots.size())
                                                         : static_cast<int>(m.slots.size());
  for (const BucketPlan& p : m.plans) s.undecided_buckets += p.graph_id < 0;
  s.steps = m.steps;
  s.rejected_steps = m.rejected;
  s.total_captures = m.total_captures;
  s.measure_ms = m.measure_ms;
  s.measured_buckets = m.measured_buckets;
  s.candidate_graphs = m.candidate_graphs;
  s.rebinds = m.rebinds;
  s.graph_updates = m.graph_updates;
  s.graph_reinstantiations = m.graph_reinstantiations;
  s.input_downloads = m.input_downloads;
  s.staging_copy_bytes = m.staging_copy_bytes;
  s.bad_block_reports = m.bad_block_reports;
  return s;
}

MemoryReport Executor::memory() const {
  const Impl& m = *impl_;
  MemoryReport r;
  r.static_buffers = m.static_bytes;
  r.workspace = m.workspace_bytes;
  r.graphs = m.graph_bytes();
  return r;
}

Stream Executor::stream() const { return impl_->backend->stream(); }

void* Executor::query(int layer) {
  impl_->check_layer(layer);
  return impl_->layers[layer].q;
}
void* Executor::output(int layer) {
  impl_->check_layer(layer);
  return impl_->layers[layer].out;
}
void* Executor::new_key(int layer) {
  impl_->check_layer(layer);
  return impl_->layers[layer].new_key;
}
void* Executor::new_value(int layer) {
  impl_->check_layer(layer);
  return impl_->layers[layer].new_value;
}

}  // namespace decodegraph
