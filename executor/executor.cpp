// The decode-step executor: configuration -> plans -> static buffers -> per-bucket graphs, and
// step(): validate, pick the bucket, stage the inputs into the static buffers, replay (capturing
// first when lazy). Backend-neutral; the backends live in host_backend.cpp and cuda/.
//
// NOTE(graph): every pointer a captured op reads (seq_lens, block_tables, slot_mapping, q/out/new
// K/V, workspace, alibi) is allocated once here and never moves; what changes between steps is
// written into those buffers by staging, never baked into a launch.
#include "decodegraph/executor.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
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

std::string mib(std::size_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

}  // namespace

long long ExecutorStats::replays(KernelKind kind) const {
  long long n = 0;
  for (const GraphStats& g : graphs)
    if (g.kernel == kind) n += g.replays;
  return n;
}

// ---------------------------------------------------------------- Impl

struct Executor::Impl {
  // Declared first so it is destroyed last: every buffer below is freed through it.
  std::unique_ptr<Backend> backend;
  std::shared_ptr<spdlog::logger> log;
  ExecutorConfig cfg;
  StepBody body;
  std::vector<BucketPlan> plans;
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
  std::vector<LayerBuffers> layers;  // resolved: caller or owned buffers

  // Host staging mirrors (pinned on CUDA) and scratch for validating device-resident inputs.
  int32_t* seq_lens_h = nullptr;
  int32_t* block_tables_h = nullptr;
  int64_t* slot_mapping_h = nullptr;
  std::vector<int32_t> seq_scratch, bt_scratch;
  std::vector<int64_t> slot_scratch;

  std::vector<std::unique_ptr<BackendGraph>> graphs;  // per plan; null until captured
  std::vector<GraphStats> graph_stats;                // per plan
  // Per plan: bytes of a graph the memory budget rejected, 0 if none (see check_graph_budget).
  std::vector<std::size_t> rejected_graph_bytes;
  long long steps = 0, rejected = 0;
  int total_captures = 0;
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
    for (const auto& g : graphs)
      if (g) n += g->bytes();
    return n;
  }
  void check_layer(int layer) const {
    if (layer < 0 || layer >= cfg.num_layers)
      throw_invalid("layer", layer, "0..num_layers-1 = 0.." + std::to_string(cfg.num_layers - 1));
  }

  int validate(const StepInputs& in);
  void stage(const StepInputs& in, const BucketPlan& plan, int max_len);
  void capture(std::size_t idx);
  void check_graph_budget(std::size_t idx, std::size_t bytes) const;
};

// ---------------------------------------------------------------- StepContext

struct StepContext::Impl {
  Executor::Impl* ex;
  const BucketPlan* plan;
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
  a.k_cache = ex.layers[layer].k_cache;
  a.v_cache = ex.layers[layer].v_cache;
  a.slot_mapping = ex.slot_mapping;
  ex.backend->append(a);
}

void StepContext::attention(int layer) {
  impl_->ex->check_layer(layer);
  attention(layer, impl_->ex->layers[layer].q, impl_->ex->layers[layer].out);
}

void StepContext::attention(int layer, const void* q, void* out) {
  Executor::Impl& ex = *impl_->ex;
  ex.check_layer(layer);
  require(q != nullptr, "q", "null", "a query buffer [max_batch, num_q_heads, head_size]");
  require(out != nullptr, "out", "null", "an output buffer [max_batch, num_q_heads, head_size]");
  const BucketPlan& p = *impl_->plan;
  DecodeArgs a;
  a.spec = ex.cfg.spec;
  a.num_seqs = p.batch;      // NOTE(graph): the bucket's padded batch, padded rows have length 0
  a.max_seq_len = p.band_hi;  // NOTE(graph): the band's upper edge sizes the grid
  a.block_table_stride = ex.cfg.max_blocks_per_seq;
  a.num_blocks = ex.cfg.num_blocks;
  a.q = q;
  a.out = out;
  a.k_cache = ex.layers[layer].k_cache;
  a.v_cache = ex.layers[layer].v_cache;
  a.block_tables = ex.block_tables;
  a.seq_lens = ex.seq_lens;
  a.alibi_slopes = ex.alibi;
  if (p.kernel == KernelKind::kV1)
    ex.backend->attention_v1(a);
  else
    ex.backend->attention_v2(a, p.partition_size, ex.workspace, ex.workspace_bytes);
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

  m.cfg = detail::resolve_config(std::move(config), m.backend->num_sms());
  m.cfg.backend = kind;
  m.body = std::move(body);
  m.plans = detail::make_plans(m.cfg);
  m.num_bands = static_cast<int>(m.cfg.band_edges.size());
  m.bucket_of_batch.assign(m.cfg.max_batch + 1, 0);
  for (int n = 1, b = 0; n <= m.cfg.max_batch; ++n) {
    while (m.cfg.batch_buckets[b] < n) ++b;
    m.bucket_of_batch[n] = b;
  }
  for (const BucketPlan& p : m.plans) m.workspace_bytes = std::max(m.workspace_bytes, p.workspace_bytes);

  // Memory: sizes first, so the budget is checked before anything is allocated.
  const ExecutorConfig& c = m.cfg;
  const std::size_t mb = static_cast<std::size_t>(c.max_batch);
  const std::size_t seq_bytes = mb * sizeof(int32_t);
  const std::size_t bt_bytes = mb * c.max_blocks_per_seq * sizeof(int32_t);
  const std::size_t slot_bytes = mb * sizeof(int64_t);
  const std::size_t alibi_bytes = c.alibi_slopes.size() * sizeof(float);
  std::size_t layer_bytes = 0;
  for (const LayerBuffers& lb : c.layers) {
    layer_bytes += (lb.q ? 0 : m.q_bytes()) + (lb.out ? 0 : m.q_bytes());
    layer_bytes += (lb.new_key ? 0 : m.kv_token_bytes()) + (lb.new_value ? 0 : m.kv_token_bytes());
  }
  m.static_bytes = seq_bytes + bt_bytes + slot_bytes + alibi_bytes + layer_bytes;
  const std::size_t needed = m.static_bytes + m.workspace_bytes;
  if (c.memory_budget_bytes != 0 && needed > c.memory_budget_bytes)
    throw_invalid("memory_budget_bytes", c.memory_budget_bytes,
                  ">= " + std::to_string(needed) + " bytes needed (static buffers " +
                      std::to_string(m.static_bytes) + " + V2 workspace " +
                      std::to_string(m.workspace_bytes) + "), or 0 for unlimited");

  // Allocation: any failure unwinds through Owned, so nothing leaks.
  m.seq_lens = static_cast<int32_t*>(m.alloc(seq_bytes));
  m.block_tables = static_cast<int32_t*>(m.alloc(bt_bytes));
  m.slot_mapping = static_cast<int64_t*>(m.alloc(slot_bytes));
  if (m.workspace_bytes) m.workspace = m.alloc(m.workspace_bytes);
  if (alibi_bytes) {
    m.alibi = static_cast<float*>(m.alloc(alibi_bytes));
    m.backend->upload(m.alibi, c.alibi_slopes.data(), alibi_bytes);
  }
  m.layers = c.layers;
  for (LayerBuffers& lb : m.layers) {
    if (!lb.q) lb.q = m.alloc(m.q_bytes());
    if (!lb.out) lb.out = m.alloc(m.q_bytes());
    if (!lb.new_key) lb.new_key = m.alloc(m.kv_token_bytes());
    if (!lb.new_value) lb.new_value = m.alloc(m.kv_token_bytes());
  }
  m.seq_lens_h = static_cast<int32_t*>(m.alloc_host(seq_bytes));
  m.block_tables_h = static_cast<int32_t*>(m.alloc_host(bt_bytes));
  m.slot_mapping_h = static_cast<int64_t*>(m.alloc_host(slot_bytes));
  m.seq_scratch.resize(mb);
  m.slot_scratch.resize(mb);
  m.graphs.resize(m.plans.size());
  m.graph_stats.resize(m.plans.size());
  m.rejected_graph_bytes.resize(m.plans.size());
  for (std::size_t i = 0; i < m.plans.size(); ++i) {
    m.graph_stats[i].batch = m.plans[i].batch;
    m.graph_stats[i].band = m.plans[i].band;
    m.graph_stats[i].kernel = m.plans[i].kernel;
  }

  m.log->info("executor: backend {}, {} layers, max_batch {}, max_seq_len {}, {} buckets x {} bands, "
              "capture {}, memory {} (static {}, workspace {})",
              to_string(kind), c.num_layers, c.max_batch, c.max_seq_len, c.batch_buckets.size(),
              m.num_bands, to_string(c.capture), mib(needed), mib(m.static_bytes),
              mib(m.workspace_bytes));
  if (m.log->should_log(spdlog::level::debug)) m.log->debug("plans:\n{}", format_plan_table(m.plans));

  if (c.capture == CapturePolicy::kUpFront) capture_all();
}

Executor::~Executor() = default;
Executor::Executor(Executor&&) noexcept = default;
Executor& Executor::operator=(Executor&&) noexcept = default;

// ---------------------------------------------------------------- step

// Checks the inputs and returns the largest seq_len. Device-resident inputs (MemorySpace::kDevice):
// seq_lens are always copied to the host (the band choice needs the largest length; num_seqs * 4
// bytes, a synchronous copy); block tables and slot mapping are copied and checked only with
// ValidationLevel::kFull. With kCheap their pointers, the table width and the lengths are checked.
int Executor::Impl::validate(const StepInputs& in) {
  if (in.num_seqs < 1 || in.num_seqs > cfg.max_batch)
    throw_invalid("inputs.num_seqs", in.num_seqs, "1..max_batch = 1.." + std::to_string(cfg.max_batch));
  if (in.space != MemorySpace::kHost && in.space != MemorySpace::kDevice)
    throw_invalid("inputs.space", static_cast<int>(in.space), "kHost or kDevice");
  if (!in.seq_lens) throw_invalid("inputs.seq_lens", "null", "a pointer to num_seqs lengths");
  if (!in.block_tables) throw_invalid("inputs.block_tables", "null", "a pointer to num_seqs block-table rows");
  if (!in.slot_mapping && cfg.append_kv)
    throw_invalid("inputs.slot_mapping", "null", "a pointer to num_seqs slots (append_kv is on)");
  const int n = in.num_seqs;
  const bool device = in.space == MemorySpace::kDevice;
  const bool full = cfg.validation == ValidationLevel::kFull;

  const int32_t* lens = in.seq_lens;
  if (device) {
    backend->download(seq_scratch.data(), in.seq_lens, n * sizeof(int32_t), in.space);
    lens = seq_scratch.data();
  }
  int max_len = 0;
  for (int i = 0; i < n; ++i) {
    const int len = lens[i];
    if (len < 1 || len > cfg.max_seq_len)
      throw_invalid("inputs.seq_lens[" + std::to_string(i) + "]", len,
                    "1..max_seq_len = 1.." + std::to_string(cfg.max_seq_len));
    max_len = std::max(max_len, len);
  }
  const int bs = cfg.spec.block_size;
  const int need_cols = (max_len + bs - 1) / bs;
  if (in.block_table_stride < need_cols)
    throw_invalid("inputs.block_table_stride", in.block_table_stride,
                  ">= ceil(max seq_len " + std::to_string(max_len) + " / block_size " +
                      std::to_string(bs) + ") = " + std::to_string(need_cols));
  if (!full) return max_len;

  const int32_t* bt = in.block_tables;
  const int64_t* slots = in.slot_mapping;
  if (device) {
    const std::size_t entries = static_cast<std::size_t>(n) * in.block_table_stride;
    if (bt_scratch.size() < entries) bt_scratch.resize(entries);  // grows once per new maximum
    backend->download(bt_scratch.data(), in.block_tables, entries * sizeof(int32_t), in.space);
    bt = bt_scratch.data();
    if (slots) {
      backend->download(slot_scratch.data(), in.slot_mapping, n * sizeof(int64_t), in.space);
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
  }
  return max_len;
}

// Copies the inputs into the static buffers for bucket `plan`. Rows [num_seqs, batch) get seq_len 0
// and slot -1. Only the block-table columns the longest sequence uses are copied: the kernels never
// read past a row's length.
void Executor::Impl::stage(const StepInputs& in, const BucketPlan& plan, int max_len) {
  const int n = in.num_seqs;
  const int pad = plan.batch - n;
  const int slots = in.slot_mapping ? n : 0;  // rows [slots, batch) get slot -1
  const std::size_t cols = static_cast<std::size_t>((max_len + cfg.spec.block_size - 1) / cfg.spec.block_size);
  const std::size_t dpitch = static_cast<std::size_t>(cfg.max_blocks_per_seq) * sizeof(int32_t);
  const std::size_t spitch = static_cast<std::size_t>(in.block_table_stride) * sizeof(int32_t);
  backend->wait_staging_reusable();
  if (in.space == MemorySpace::kHost) {
    std::memcpy(seq_lens_h, in.seq_lens, n * sizeof(int32_t));
    std::fill(seq_lens_h + n, seq_lens_h + plan.batch, 0);
    if (slots) std::memcpy(slot_mapping_h, in.slot_mapping, slots * sizeof(int64_t));
    std::fill(slot_mapping_h + slots, slot_mapping_h + plan.batch, int64_t{-1});
    const std::size_t width = cols * sizeof(int32_t);
    for (int i = 0; i < n; ++i)
      std::memcpy(reinterpret_cast<char*>(block_tables_h) + i * dpitch,
                  reinterpret_cast<const char*>(in.block_tables) + i * spitch, width);
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

// Captures and instantiates the graph of plan `idx`. On any exception the capture is ended and
// discarded (no partial graph), and the plan stays uncaptured.
void Executor::Impl::capture(std::size_t idx) {
  if (rejected_graph_bytes[idx] != 0) check_graph_budget(idx, rejected_graph_bytes[idx]);  // throws
  detail::NvtxRange range("decodegraph::capture");
  const BucketPlan& plan = plans[idx];
  const auto t0 = std::chrono::steady_clock::now();
  backend->begin_capture();
  struct Abort {  // ends an abandoned capture when the body throws
    Backend* b;
    bool armed = true;
    ~Abort() {
      if (armed) b->abort_capture();
    }
  } abort{backend.get()};
  StepContext::Impl ctx_impl{this, &plan};
  StepContext ctx(&ctx_impl);
  if (body) {
    body(ctx);
  } else {
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (cfg.append_kv) ctx.append_kv(l);
      ctx.attention(l);
    }
  }
  const double capture_ms = ms_since(t0);
  abort.armed = false;  // end_capture_and_instantiate ends the capture on every path
  const auto t1 = std::chrono::steady_clock::now();
  std::unique_ptr<BackendGraph> g = backend->end_capture_and_instantiate();
  const double inst_ms = ms_since(t1);
  try {
    check_graph_budget(idx, g->bytes());
  } catch (const Error&) {
    rejected_graph_bytes[idx] = g->bytes();
    throw;
  }
  GraphStats& s = graph_stats[idx];
  s.captures += 1;
  s.nodes = g->nodes();
  s.capture_ms = capture_ms;
  s.instantiate_ms = inst_ms;
  graphs[idx] = std::move(g);
  ++total_captures;
  log->info("captured bucket batch {} band {} ({},{}] {}: {} nodes, capture {:.3f} ms, instantiate "
            "{:.3f} ms, graph memory {}",
            plan.batch, plan.band, plan.band_lo, plan.band_hi, to_string(plan.kernel), s.nodes,
            capture_ms, inst_ms, mib(graphs[idx]->bytes()));
}

// Static buffers and workspace are checked against memory_budget_bytes at construction; graph
// memory is known only once a bucket is captured, so it is checked here, before the graph is kept.
// With CapturePolicy::kUpFront an over-budget bucket therefore fails construction; with kLazy the
// step that first needs it throws. Executor memory only grows (graphs are never freed), so a
// rejected bucket can never fit later: capture() remembers it and throws the same error at once,
// without capturing it again.
void Executor::Impl::check_graph_budget(std::size_t idx, std::size_t bytes) const {
  if (cfg.memory_budget_bytes == 0) return;
  const std::size_t total = static_bytes + workspace_bytes + graph_bytes() + bytes;
  if (total > cfg.memory_budget_bytes)
    throw_invalid("memory_budget_bytes", cfg.memory_budget_bytes,
                  ">= " + std::to_string(total) + " bytes to hold the graph of bucket (batch " +
                      std::to_string(plans[idx].batch) + ", band " + std::to_string(plans[idx].band) +
                      "), or 0 for unlimited");
}

StepResult Executor::step(const StepInputs& inputs) {
  detail::NvtxRange range("decodegraph::step");
  Impl& m = *impl_;
  StepResult r;
  try {
    const int max_len = m.validate(inputs);
    const int bucket = m.bucket_of_batch[inputs.num_seqs];
    const auto& e = m.cfg.band_edges;
    const int band = static_cast<int>(std::lower_bound(e.begin(), e.end(), max_len) - e.begin());
    const std::size_t idx = static_cast<std::size_t>(bucket) * m.num_bands + band;
    const BucketPlan& plan = m.plans[idx];
    m.stage(inputs, plan, max_len);
    if (!m.graphs[idx]) {
      m.capture(idx);
      r.captured = true;
    }
    m.backend->launch(*m.graphs[idx]);
    ++m.graph_stats[idx].replays;
    r.batch_bucket = plan.batch;
    r.band = plan.band;
    r.band_hi = plan.band_hi;
    r.kernel = plan.kernel;
    r.partition_size = plan.partition_size;
  } catch (...) {
    ++m.rejected;
    throw;
  }
  ++m.steps;
  if (m.log->should_log(spdlog::level::trace))
    m.log->trace("step {}: num_seqs {} -> batch {} band {} ({}){}", m.steps, inputs.num_seqs,
                 r.batch_bucket, r.band, to_string(r.kernel), r.captured ? ", captured" : "");
  return r;
}

void Executor::capture_all() {
  Impl& m = *impl_;
  for (std::size_t i = 0; i < m.plans.size(); ++i)
    if (!m.graphs[i]) m.capture(i);
}

// ---------------------------------------------------------------- accessors

BackendKind Executor::backend() const { return impl_->backend->kind(); }
const ExecutorConfig& Executor::config() const { return impl_->cfg; }
const std::vector<BucketPlan>& Executor::plans() const { return impl_->plans; }

const BucketPlan& Executor::plan_for(int batch_bucket_index, int band) const {
  const Impl& m = *impl_;
  const int nb = static_cast<int>(m.cfg.batch_buckets.size());
  if (batch_bucket_index < 0 || batch_bucket_index >= nb)
    throw_invalid("batch_bucket_index", batch_bucket_index, "0.." + std::to_string(nb - 1));
  if (band < 0 || band >= m.num_bands)
    throw_invalid("band", band, "0.." + std::to_string(m.num_bands - 1));
  return m.plans[static_cast<std::size_t>(batch_bucket_index) * m.num_bands + band];
}

std::string Executor::plan_table() const { return format_plan_table(impl_->plans); }

ExecutorStats Executor::stats() const {
  const Impl& m = *impl_;
  ExecutorStats s;
  for (const GraphStats& g : m.graph_stats)
    if (g.captures > 0) s.graphs.push_back(g);
  s.steps = m.steps;
  s.rejected_steps = m.rejected;
  s.total_captures = m.total_captures;
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
