// decode_loop: the decode-loop benchmark, and the first program a new user runs.
//
// It allocates paged KV caches (random data) and block tables, then simulates a decode loop: every
// step each sequence grows by one token, a new block is appended to its block table when the token
// starts one, and the token's slot goes into slot_mapping. Each step replays through the Executor
// (append the new K/V, then attention, for every layer) and runs again eagerly (CUDA: the eager
// launchers; host backend: the host:: implementation) on the same inputs; the outputs must agree
// (bitwise on a GPU, within tolerance on the host backend), otherwise the program exits non-zero.
//
// The run is split into segments, one per --start-lens entry ("N" or "MIN:MAX" spread over the
// batch); each runs --steps steps from its start lengths. Segments that start just below a band edge
// walk across it, so one run shows several bands and the V1 -> V2 swap at the threshold.
//
// Output: the device model and the plan table, the per-band table (eager vs graph latency, GB/s by
// the bytes model of docs/design.md, % of the read bandwidth measured in the same run), kAuto's and
// kThreshold's choice per band side by side, capture statistics; --json / --csv. --policy picks the
// executor's KernelPolicy; --plan-only prints (and --json writes) the plans without running a step
// (docs/planning.md).
// Options are parsed by CLI11, output formatted by fmt, and the JSON written with nlohmann::json.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "decodegraph/decodegraph.hpp"

namespace dg = decodegraph;
using json = nlohmann::ordered_json;

namespace {

// ---------------------------------------------------------------- options

struct Options {
  std::string preset;
  int q_heads = 0, kv_heads = 0, head_size = 0, block_size = 0;
  std::string dtype, layout;
  int batch = 0;
  std::string start_lens;
  int steps = 0;
  int layers = 0;
  std::string backend = "auto";
  std::string partition = "auto";
  int threshold = 8192;
  std::string policy = "auto";
  std::string band_select = "device";
  bool capture_compare = false;
  std::string device_model;  // "sms=N,blocks_per_sm=M"; empty: the backend's (host: an H200 model)
  bool plan_only = false;
  std::string capture = "lazy";  // lazy: a bucket's graph at its first step; up-front: every graph at construction
  int max_seq_len = 0;
  std::string json_path;
  bool csv = false;
  std::uint64_t seed = 1;
  bool check = true;
  bool progress = true;
  /// Options the command line set (long names with dashes); the others are reported as defaults.
  std::set<std::string> given;
};

/// A bad command line: main prints the message and exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void usage_error(const std::string& msg) { throw UsageError(msg); }

/// "a string that `parse` accepts": a CLI11 check from one of the library's parsers.
template <typename Parse>
CLI::Validator parsed_by(Parse parse, const std::string& what) {
  return CLI::Validator(
      [parse](std::string& v) -> std::string {
        try {
          parse(v);
          return {};
        } catch (const dg::Error& e) {
          return e.what();
        }
      },
      what);
}

/// Parses a whole integer of an option's value (no sign, no trailing text) within [lo, hi].
int parse_int_in(const std::string& what, const std::string& v, int lo, int hi) {
  int x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi)
    usage_error(fmt::format("{} = '{}' is invalid; allowed: an integer in {}..{}", what, v, lo, hi));
  return x;
}

/// --device-model "sms=N,blocks_per_sm=M": fields left out stay 0 (the backend's value).
dg::DeviceModel parse_device_model(const std::string& text) {
  dg::DeviceModel d;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "sms") d.num_sms = parse_int_in("--device-model sms", value, 1, 65536);
    else if (key == "blocks_per_sm") d.blocks_per_sm = parse_int_in("--device-model blocks_per_sm", value, 1, 64);
    else usage_error(fmt::format("--device-model entry '{}' is invalid; allowed: sms=N, blocks_per_sm=M", item));
  }
  if (d.num_sms == 0 && d.blocks_per_sm == 0) usage_error("--device-model is empty; allowed: sms=N,blocks_per_sm=M");
  return d;
}

/// Where the device model's numbers came from, for the output.
std::string model_source(const std::string& option, bool gpu) {
  const char* backend = gpu ? "queried from the device" : "host model of an H200";
  if (option.empty()) return backend;
  const dg::DeviceModel d = parse_device_model(option);
  if (d.num_sms != 0 && d.blocks_per_sm != 0) return "--device-model";
  return std::string("--device-model; ") + (d.num_sms ? "blocks per SM " : "SMs ") +
         (gpu ? "queried from the device" : "from the host model of an H200");
}

/// Parses the command line. Returns the exit status when the program should stop here (--help: 0).
std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app(
      "Simulates a decode loop over a paged KV cache and replays each step through the decodegraph\n"
      "Executor, checking it against eager launches and timing both per length band.",
      "decode_loop");
  app.get_formatter()->column_width(34);
  const CLI::Validator ints = CLI::Range(1, 1 << 30).description(">= 1");

  std::vector<std::string> preset_names;
  for (const auto& p : dgbench::model_presets()) preset_names.push_back(p.name);
  app.add_option("--preset", o.preset,
                 "llama3-8b (32q/8kv), llama3-70b-tp8 (8q/1kv), mha (32q/32kv) [head 128, block 16, bf16]; "
                 "small (8q/2kv, head 64, block 16, bf16)")
      ->check(CLI::IsMember(preset_names))
      ->group("shape");
  app.add_option("--q-heads", o.q_heads, "override the preset's query heads")->check(ints)->group("shape");
  app.add_option("--kv-heads", o.kv_heads, "override the preset's KV heads")->check(ints)->group("shape");
  app.add_option("--head-size", o.head_size, "override the preset's head size")->check(ints)->group("shape");
  app.add_option("--block-size", o.block_size, "override the preset's block size")->check(ints)->group("shape");
  app.add_option("--dtype", o.dtype, "override the preset's dtype")
      ->check(parsed_by([](const std::string& s) { dg::parse_dtype(s); }, "fp16|bf16|fp32"))
      ->group("shape");
  app.add_option("--layout", o.layout, "override the preset's KV layout")
      ->check(parsed_by([](const std::string& s) { dg::parse_layout(s); }, "vllm|nhd"))
      ->group("shape");

  app.add_option("--batch", o.batch, "sequences per step")->check(ints)->group("loop");
  app.add_option("--start-lens", o.start_lens,
                 "comma-separated segments; each \"N\" (every sequence starts at N tokens) or \"MIN:MAX\" "
                 "(start lengths spread over the batch). Each segment runs --steps steps.")
      ->group("loop");
  app.add_option("--steps", o.steps, "steps per segment")->check(ints)->group("loop");
  app.add_option("--layers", o.layers, "layers (each with its own KV cache)")->check(ints)->group("loop");
  app.add_option("--max-seq-len", o.max_seq_len,
                 "executor max_seq_len (default: next power of two >= the longest length)")
      ->check(ints)
      ->group("loop");

  app.add_option("--backend", o.backend, "auto: cuda when a device is present")
      ->check(CLI::IsMember({"auto", "cuda", "host"}))
      ->group("executor");
  app.add_option("--partition", o.partition, "V2 partition size: auto, or N (a multiple of the block size)")
      ->check((CLI::IsMember({"auto"}) | ints).description("auto|N"))
      ->group("executor");
  app.add_option("--threshold", o.threshold, "V1/V2 threshold")->capture_default_str()->check(ints)->group("executor");
  app.add_option("--policy", o.policy,
                 "how buckets pick V1/V2 and P: auto (fill the GPU's resident slots), threshold (V1 up to "
                 "the threshold), measured (time candidates at capture); see docs/planning.md")
      ->check(CLI::IsMember({"auto", "threshold", "measured"}))
      ->capture_default_str()
      ->group("executor");
  app.add_option("--band-select", o.band_select,
                 "where each step's band is chosen: device (one graph per batch bucket, a SWITCH node picks "
                 "the band in the graph; falls back to host without CUDA 12.8) or host; see docs/executor.md")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str()
      ->group("executor");
  app.add_flag("--capture-compare", o.capture_compare,
               "with --plan-only: capture every bucket up front under --band-select host and device (host "
               "backend) and print graphs, nodes and capture time side by side")
      ->group("executor");
  app.add_option("--device-model", o.device_model,
                 "plan for this GPU: sms=N,blocks_per_sm=M (either may be left out); default: the device's "
                 "(host backend: an H200, 132 SMs, and the pass-1 kernel's occupancy)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              parse_device_model(v);
              return {};
            } catch (const UsageError& e) {
              return e.what();
            }
          },
          "sms=N,blocks_per_sm=M"))
      ->group("executor");
  app.add_option("--capture", o.capture,
                 "lazy: each bucket's graph is captured at its first step; up-front: every bucket's graph at "
                 "construction (the capture statistics then cover all buckets)")
      ->capture_default_str()
      ->check(CLI::IsMember({"lazy", "up-front"}))
      ->group("executor");
  app.add_flag("--plan-only", o.plan_only,
               "print (and with --json write) every bucket's plan for the host model or --device-model, "
               "then exit without allocating caches or running a step")
      ->group("executor");

  app.add_option("--json", o.json_path, "write everything as JSON (plot it with bench/plot_decode_loop.py)")
      ->group("output");
  app.add_flag("--csv", o.csv, "print the per-band table as CSV on stdout; everything else goes to stderr")
      ->group("output");
  bool no_progress = false, no_check = false;
  app.add_flag("--no-progress", no_progress, "no progress bar (it is drawn only when stderr is a terminal)")
      ->group("output");
  app.add_option("--seed", o.seed, "random data seed")->capture_default_str()->group("output");
  app.add_flag("--no-check", no_check, "skip the eager-vs-graph output comparison (eager is still timed)")
      ->group("output");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "decode_loop: {}\n(run decode_loop --help for the options)\n", e.what());
    return 2;
  }
  o.progress = !no_progress;
  o.check = !no_check;
  for (const CLI::Option* opt : app.get_options())
    if (opt->count() > 0) o.given.insert(opt->get_name());
  return std::nullopt;
}

/// Parses a whole non-negative integer of a --start-lens entry.
int parse_length(const std::string& what, const std::string& v) { return parse_int_in(what, v, 0, 1 << 30); }

/// One --start-lens entry: start lengths for the batch.
struct Segment {
  std::string label;
  std::vector<int> start;
};

std::vector<Segment> parse_segments(const std::string& text, int batch) {
  std::vector<Segment> segs;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    Segment s;
    s.label = item;
    const auto colon = item.find(':');
    int lo, hi;
    if (colon == std::string::npos) {
      lo = hi = parse_length("--start-lens entry", item);
    } else {
      lo = parse_length("--start-lens MIN", item.substr(0, colon));
      hi = parse_length("--start-lens MAX", item.substr(colon + 1));
      if (hi < lo) usage_error(fmt::format("--start-lens entry '{}' has MAX < MIN", item));
    }
    for (int i = 0; i < batch; ++i)
      s.start.push_back(batch == 1 ? hi
                                   : lo + static_cast<int>(std::lround(static_cast<double>(hi - lo) * i /
                                                                       (batch - 1))));
    segs.push_back(std::move(s));
  }
  if (segs.empty()) usage_error("--start-lens is empty");
  return segs;
}

// ---------------------------------------------------------------- memory (host or device)

/// A buffer in the backend's memory space: device memory on CUDA, 16-byte-aligned host memory on the
/// host backend.
class Buffer {
 public:
  Buffer() = default;
  Buffer(bool device, std::size_t bytes) : device_(device), bytes_(bytes) {
    if (bytes == 0) return;
    if (device) {
#if DECODEGRAPH_HAS_CUDA
      DGB_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
#endif
    } else {
      host_.resize((bytes + 15) / 16);
      ptr_ = host_.data();
    }
  }
  ~Buffer() {
#if DECODEGRAPH_HAS_CUDA
    if (device_ && ptr_) cudaFree(ptr_);
#endif
  }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(bytes_, o.bytes_);
    std::swap(ptr_, o.ptr_);
    std::swap(host_, o.host_);
    return *this;
  }
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  struct alignas(16) Chunk {
    unsigned char b[16];
  };
  bool device_ = false;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
  std::vector<Chunk> host_;
};

/// Pinned host memory on CUDA (fast, truly async staging), plain vectors otherwise.
template <typename T>
class HostArray {
 public:
  HostArray(bool pinned, std::size_t n) : pinned_(pinned), n_(n) {
#if DECODEGRAPH_HAS_CUDA
    if (pinned_) {
      DGB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), std::max<std::size_t>(n, 1) * sizeof(T)));
      std::fill(ptr_, ptr_ + n, T{});
      return;
    }
#endif
    pinned_ = false;
    vec_.assign(n, T{});
    ptr_ = vec_.data();
  }
  ~HostArray() {
#if DECODEGRAPH_HAS_CUDA
    if (pinned_) cudaFreeHost(ptr_);
#endif
  }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  T& operator[](std::size_t i) { return ptr_[i]; }
  std::size_t size() const { return n_; }

 private:
  bool pinned_;
  std::size_t n_;
  T* ptr_ = nullptr;
  std::vector<T> vec_;
};

// ---------------------------------------------------------------- progress bar

/// Drawn on stderr, only when it is a terminal and the run has taken more than a second.
class Progress {
 public:
  Progress(bool enabled, long total) : enabled_(enabled && isatty(2)), total_(total) {}
  void update(long done, const std::string& label) {
    if (!enabled_) return;
    const double t = seconds_since(start_);
    if (t < 1.0 || seconds_since(last_) < 0.1) return;
    last_ = Clock::now();
    const int width = 30;
    const int filled = static_cast<int>(width * done / std::max(1L, total_));
    const double eta = done > 0 ? t * static_cast<double>(total_ - done) / static_cast<double>(done) : 0;
    fmt::print(stderr, "\r[{}{}] {:3}%  step {}/{}  {}  eta {:.0f}s   ", std::string(static_cast<std::size_t>(filled), '#'),
               std::string(static_cast<std::size_t>(width - filled), ' '), 100 * done / std::max(1L, total_), done,
               total_, label, eta);
    std::fflush(stderr);
    drawn_ = true;
  }
  void finish() {
    if (drawn_) fmt::print(stderr, "\r{:80}\r", "");
    drawn_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  bool enabled_;
  long total_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = Clock::now();
  bool drawn_ = false;
};

// ---------------------------------------------------------------- per-step record, per-band rows

struct StepRecord {
  int segment = 0;
  int step = 0;
  int band = 0;
  int band_lo = 0, band_hi = 0;
  dg::KernelKind kernel = dg::KernelKind::kV1;
  int partition_size = 0;
  bool captured = false;
  bool measured = false;  // the step timed kMeasured's candidates
  int graph_id = -1;
  int max_len = 0;
  double bytes = 0;  // bytes model, all layers
  double eager_us = 0;
  double graph_us = 0;
  double max_abs_diff = 0;
  bool bitwise_equal = true;
};

struct BandRow {
  int band = 0, band_lo = 0, band_hi = 0;
  dg::KernelKind kernel = dg::KernelKind::kV1;
  int partition_size = 0;
  int steps = 0;           // all steps in the band
  int timed_steps = 0;     // graph steps that replayed without capturing
  double eager_p50 = 0, eager_p99 = 0, graph_p50 = 0, graph_p99 = 0;
  double speedup = 0;      // eager p50 / graph p50
  double bytes_per_step = 0;
  double gbs = 0;          // bytes_per_step / graph p50
  double pct_read_bw = -1; // -1: n/a
  double pct_copy_bw = -1; // of the d2d copy bandwidth (read + write); -1: n/a
  double max_abs_diff = 0;
};

std::vector<BandRow> band_rows(const std::vector<StepRecord>& recs, double read_bw_gbs, double copy_bw_gbs) {
  std::map<std::tuple<int, int, int>, std::vector<const StepRecord*>> groups;
  for (const auto& r : recs) groups[{r.band, static_cast<int>(r.kernel), r.partition_size}].push_back(&r);
  std::vector<BandRow> rows;
  for (const auto& [key, g] : groups) {
    BandRow row;
    row.band = g.front()->band;
    row.band_lo = g.front()->band_lo;
    row.band_hi = g.front()->band_hi;
    row.kernel = g.front()->kernel;
    row.partition_size = g.front()->partition_size;
    row.steps = static_cast<int>(g.size());
    std::vector<double> eager, graph;
    double bytes = 0;
    for (const auto* r : g) {
      eager.push_back(r->eager_us);
      bytes += r->bytes;
      row.max_abs_diff = std::max(row.max_abs_diff, r->max_abs_diff);
      // A capturing (or measuring) step times the capture, not a replay.
      if (!r->captured && !r->measured) graph.push_back(r->graph_us);
    }
    row.timed_steps = static_cast<int>(graph.size());
    row.bytes_per_step = bytes / static_cast<double>(g.size());
    row.eager_p50 = dgbench::percentile(eager, 50);
    row.eager_p99 = dgbench::percentile(eager, 99);
    if (!graph.empty()) {
      row.graph_p50 = dgbench::percentile(graph, 50);
      row.graph_p99 = dgbench::percentile(graph, 99);
      row.speedup = row.graph_p50 > 0 ? row.eager_p50 / row.graph_p50 : 0;
      row.gbs = row.graph_p50 > 0 ? row.bytes_per_step / (row.graph_p50 * 1e-6) / 1e9 : 0;
      if (read_bw_gbs > 0) row.pct_read_bw = 100.0 * row.gbs / read_bw_gbs;
      if (copy_bw_gbs > 0) row.pct_copy_bw = 100.0 * row.gbs / copy_bw_gbs;
    }
    rows.push_back(row);
  }
  return rows;
}

std::string band_label(int lo, int hi) { return fmt::format("({}, {}]", lo, hi); }

// ---------------------------------------------------------------- JSON

/// A number, or null where there is none (non-finite, or not measured).
json num_or_null(double v, bool present = true) { return present && std::isfinite(v) ? json(v) : json(nullptr); }

/// One bucket's plan as structured data (docs/planning.md lists the fields).
json plan_json(const dg::BucketPlan& p) {
  json j = {{"batch", p.batch},
            {"band_lo", p.band_lo},
            {"band_hi", p.band_hi},
            {"kernel", dg::to_string(p.kernel)},
            {"partition_size", p.partition_size},
            {"partitions", p.max_partitions},
            {"blocks", p.blocks},
            {"target_blocks", p.target_blocks},
            {"live_blocks_at_band_lo", p.live_blocks_at_band_lo},
            {"graph_id", p.graph_id},
            {"band", p.band},
            {"design_len", p.design_len},
            {"launch_len", p.launch_len},
            {"waves", p.waves},
            {"reason", dg::to_string(p.reason)},
            {"why", dg::describe_reason(p)},
            {"grid", {p.grid_x, p.grid_y, p.grid_z}},
            {"merge_grid", {p.merge_grid_x, p.merge_grid_y}},
            {"workspace_bytes", p.workspace_bytes}};
  if (!p.candidates.empty()) {
    json c = json::array();
    for (const dg::PlanCandidate& k : p.candidates)
      c.push_back({{"kernel", dg::to_string(k.kernel)},
                   {"partition_size", k.partition_size},
                   {"us", num_or_null(k.us, k.us >= 0)}});
    j["candidates"] = c;
  }
  return j;
}

json plans_json(const std::vector<dg::BucketPlan>& plans) {
  json a = json::array();
  for (const dg::BucketPlan& p : plans) a.push_back(plan_json(p));
  return a;
}

json device_model_json(const dg::DeviceModel& d, const std::string& source) {
  return {{"num_sms", d.num_sms}, {"blocks_per_sm", d.blocks_per_sm}, {"target_blocks", d.target_blocks()},
          {"source", source}};
}

/// What capturing every bucket up front costs under one band choice (a separate executor).
struct CaptureCost {
  std::string mode;  // the band choice in effect ("host", or "device")
  int graphs = 0, buckets = 0, distinct_plans = 0;
  long long nodes = 0;
  double capture_ms = 0, instantiate_ms = 0;
  std::size_t graph_bytes = 0;
  std::string note;  // why kDevice fell back, if it did
};

CaptureCost capture_cost(dg::ExecutorConfig cfg, dg::BandSelect mode) {
  cfg.band_select = mode;
  cfg.capture = dg::CapturePolicy::kUpFront;
  dg::Executor ex(cfg);
  const dg::ExecutorStats st = ex.stats();
  CaptureCost c;
  c.mode = dg::to_string(ex.band_select());
  c.graphs = st.total_captures;
  c.buckets = st.buckets;
  c.distinct_plans = st.distinct_plans;
  for (const dg::GraphStats& g : st.graphs) c.nodes += g.nodes;
  c.capture_ms = st.capture_ms;
  c.instantiate_ms = st.instantiate_ms;
  c.graph_bytes = ex.memory().graphs;
  c.note = st.band_select_note;
  return c;
}

int distinct_graphs(const std::vector<dg::BucketPlan>& plans) {
  std::set<int> ids;
  for (const dg::BucketPlan& p : plans) ids.insert(p.graph_id);
  return static_cast<int>(ids.size());
}

std::string kernel_label(const dg::BucketPlan& p) {
  return p.kernel == dg::KernelKind::kV2 ? fmt::format("v2 P={}", p.partition_size) : std::string("v1");
}

// ---------------------------------------------------------------- kAuto against kThreshold

/// kAuto's and kThreshold's plan for one band of the run's batch bucket, and why they differ.
struct PolicyRow {
  dg::BucketPlan automatic, threshold;
  std::string why;
};

std::vector<PolicyRow> compare_policies(dg::ExecutorConfig cfg, int batch) {
  cfg.policy = dg::KernelPolicy::kAuto;
  const std::vector<dg::BucketPlan> a = dg::plan_buckets(cfg);
  cfg.policy = dg::KernelPolicy::kThreshold;
  const std::vector<dg::BucketPlan> t = dg::plan_buckets(cfg);
  std::vector<PolicyRow> rows;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].batch != batch) continue;
    PolicyRow r{a[i], t[i], {}};
    if (a[i].kernel == t[i].kernel && a[i].partition_size == t[i].partition_size)
      r.why = a[i].band_hi > cfg.v2_threshold ? "same: above the threshold every policy runs V2 (the swap)"
                                              : "same: V1 already fills the GPU";
    else
      r.why = "differ: " + dg::describe_reason(a[i]);
    rows.push_back(std::move(r));
  }
  return rows;
}

json policies_json(const std::vector<PolicyRow>& rows) {
  json a = json::array();
  auto side = [](const dg::BucketPlan& p) {
    return json{{"kernel", dg::to_string(p.kernel)},
                {"partition_size", p.partition_size},
                {"blocks", p.blocks},
                {"live_blocks_at_band_lo", p.live_blocks_at_band_lo}};
  };
  for (const PolicyRow& r : rows)
    a.push_back({{"band_lo", r.automatic.band_lo},
                 {"band_hi", r.automatic.band_hi},
                 {"auto", side(r.automatic)},
                 {"threshold", side(r.threshold)},
                 {"why", r.why}});
  return a;
}

std::string policies_table(const std::vector<PolicyRow>& rows) {
  constexpr const char* kRow = "{:<16} {:>10} {:>8}  {:>10} {:>8}  {}\n";
  std::string s = fmt::format(kRow, "band", "kAuto", "live@lo", "kThreshold", "live@lo", "why");
  for (const PolicyRow& r : rows)
    s += fmt::format(kRow, fmt::format("({}, {}]", r.automatic.band_lo, r.automatic.band_hi),
                     kernel_label(r.automatic), r.automatic.live_blocks_at_band_lo, kernel_label(r.threshold),
                     r.threshold.live_blocks_at_band_lo, r.why);
  return s;
}

void write_json(const std::string& path, const json& j) {
  std::ofstream f(path);
  if (!f) usage_error("--json: cannot write '" + path + "'");
  f << j.dump(2) << "\n";
  if (!f) usage_error("--json: writing '" + path + "' failed");
}

// ---------------------------------------------------------------- the run

struct Tolerance {
  double atol, rtol;
};
/// Host backend: eager (host::) against graph replay (recorded host::) -- the same code, so any
/// difference beyond rounding of the output dtype is a bug. Also used against the float64 reference.
Tolerance tolerance_for(dg::DType t) {
  switch (t) {
    case dg::DType::kBFloat16: return {2e-2, 2e-2};  // bf16: 8 mantissa bits, eps 7.8e-3
    case dg::DType::kFloat16: return {4e-3, 4e-3};   // fp16: eps 9.8e-4
    case dg::DType::kFloat32: return {1e-4, 1e-4};
  }
  return {0, 0};
}

/// --plan-only: every bucket's plan for the host model (or --device-model), as a table and, with
/// --json, as one object per bucket. No cache is allocated and no step runs.
int plan_only(const Options& opt, dg::ExecutorConfig cfg, const std::vector<std::string>& defaults_used,
              std::FILE* out) {
  const dg::DeviceModel host = dg::host_device_model(cfg.spec);
  const std::string source = model_source(opt.device_model, /*gpu=*/false);
  if (cfg.device_model.num_sms == 0) cfg.device_model.num_sms = host.num_sms;
  if (cfg.device_model.blocks_per_sm == 0) cfg.device_model.blocks_per_sm = host.blocks_per_sm;
  const std::vector<dg::BucketPlan> plans = dg::plan_buckets(cfg);
  const dg::AttentionSpec& s = cfg.spec;
  fmt::print(out, "decodegraph {} decode_loop --plan-only\n", dg::version());
  std::vector<std::string> planning_defaults;  // only the options planning reads
  for (const std::string& d : defaults_used)
    for (const char* flag : {"--preset ", "--batch ", "--max-seq-len ", "--partition ", "--threshold ", "--policy "})
      if (d.rfind(flag, 0) == 0) planning_defaults.push_back(d);
  if (!planning_defaults.empty()) fmt::print(out, "defaults used: {};\n", fmt::join(planning_defaults, "; "));
  fmt::print(out, "shape: {} q heads, {} kv heads, head {}, block {}, {}; max_batch {}, max_seq_len {}, threshold {}\n",
             s.num_q_heads, s.num_kv_heads, s.head_size, s.block_size, dg::to_string(s.dtype), cfg.max_batch,
             cfg.max_seq_len, cfg.v2_threshold);
  fmt::print(out, "policy {}; device model {} SMs x {} resident pass-1 blocks = {} slots ({})\n", opt.policy,
             cfg.device_model.num_sms, cfg.device_model.blocks_per_sm, cfg.device_model.target_blocks(), source);
  fmt::print(out, "{} buckets, {} distinct graphs{}:\n{}", plans.size(),
             cfg.policy == dg::KernelPolicy::kMeasured ? std::string("(decided when measured)")
                                                       : std::to_string(distinct_graphs(plans)),
             cfg.policy == dg::KernelPolicy::kMeasured ? "; kMeasured starts from kAuto's choice" : "",
             dg::format_plan_table(plans));
  // --capture-compare: every bucket captured up front under kHost and under kDevice, on the host
  // backend (capture does not read the caches, so each layer gets a one-block cache).
  std::vector<CaptureCost> costs;
  if (opt.capture_compare) {
    if (cfg.policy == dg::KernelPolicy::kMeasured) usage_error("--capture-compare needs --policy auto or threshold");
    dg::ExecutorConfig ec = cfg;
    ec.backend = dg::BackendKind::kHost;
    ec.num_blocks = 1;
    ec.num_layers = opt.layers;
    const std::size_t block_bytes = s.block_elems() * dg::dtype_size(s.dtype);
    std::vector<Buffer> caches;
    caches.reserve(2 * static_cast<std::size_t>(opt.layers));  // Buffer points into itself on host: never moved
    for (int l = 0; l < 2 * opt.layers; ++l) caches.emplace_back(false, block_bytes);
    for (int l = 0; l < opt.layers; ++l) ec.layers.push_back(dg::LayerBuffers{caches[2 * l].get(), caches[2 * l + 1].get()});
    for (const dg::BandSelect mode : {dg::BandSelect::kHost, dg::BandSelect::kDevice}) costs.push_back(capture_cost(ec, mode));
    std::vector<std::vector<std::string>> t = {
        {"band select", "graphs", "buckets", "distinct plans", "nodes", "capture ms", "instantiate ms"}};
    for (const CaptureCost& c : costs)
      t.push_back({c.mode, std::to_string(c.graphs), std::to_string(c.buckets), std::to_string(c.distinct_plans),
                   std::to_string(c.nodes), fmt::format("{:.2f}", c.capture_ms), fmt::format("{:.2f}", c.instantiate_ms)});
    fmt::print(out, "\ncapture cost, every bucket captured up front, {} layers, host backend (CPU times of recording "
                    "closures, not CUDA capture times; graph memory n/a on host):\n{}",
               opt.layers, dgbench::format_table(t));
  }
  if (!opt.json_path.empty()) {
    json j;
    if (!costs.empty()) {
      json jc = json::array();
      for (const CaptureCost& c : costs)
        jc.push_back({{"band_select", c.mode}, {"graphs", c.graphs}, {"buckets", c.buckets},
                      {"distinct_plans", c.distinct_plans}, {"nodes", c.nodes}, {"capture_ms", c.capture_ms},
                      {"instantiate_ms", c.instantiate_ms}, {"layers", opt.layers}, {"backend", "host"}});
      j["capture_compare"] = jc;
    }
    j["program"] = "decode_loop";
    j["version"] = dg::version();
    j["mode"] = "plan-only";
    j["config"] = {{"preset", opt.preset},
                   {"q_heads", s.num_q_heads},
                   {"kv_heads", s.num_kv_heads},
                   {"head_size", s.head_size},
                   {"block_size", s.block_size},
                   {"dtype", dg::to_string(s.dtype)},
                   {"max_batch", cfg.max_batch},
                   {"max_seq_len", cfg.max_seq_len},
                   {"threshold", cfg.v2_threshold},
                   {"partition", opt.partition}};
    j["policy"] = opt.policy;
    j["device_model"] = device_model_json(cfg.device_model, source);
    j["buckets"] = plans.size();
    j["distinct_graphs"] = cfg.policy == dg::KernelPolicy::kMeasured ? json(nullptr) : json(distinct_graphs(plans));
    j["plans"] = plans_json(plans);
    write_json(opt.json_path, j);
    fmt::print(out, "json: {}\n", opt.json_path);
  }
  return 0;
}

int run(int argc, char** argv) {
  Options opt;
  if (const std::optional<int> status = parse_options(argc, argv, opt)) return *status;
  std::FILE* out = opt.csv ? stderr : stdout;  // with --csv, stdout carries only the CSV table

  // Backend first: the defaults depend on it.
  dg::BackendKind backend;
  if (opt.backend == "auto") backend = dg::cuda_device_available() ? dg::BackendKind::kCuda : dg::BackendKind::kHost;
  else backend = opt.backend == "cuda" ? dg::BackendKind::kCuda : dg::BackendKind::kHost;  // checked by CLI11
  const bool gpu = backend == dg::BackendKind::kCuda;
  if (gpu && !dg::cuda_device_available())
    usage_error(dg::built_with_cuda() ? "--backend cuda: no usable CUDA device is present"
                                      : "--backend cuda: this build has no CUDA (configure with a CUDA compiler)");

  // Defaults: on the host backend they keep the run within about a minute on 2 CPU cores, yet still
  // cross four band edges including the V1/V2 threshold at 8192.
  std::vector<std::string> defaults_used;
  auto def = [&](const char* flag, const std::string& shown) {
    if (!opt.given.count(flag)) defaults_used.push_back(std::string(flag) + " " + shown);
  };
  if (opt.preset.empty()) opt.preset = gpu ? "llama3-8b" : "small";
  def("--preset", opt.preset);
  const dgbench::ModelPreset* preset = dgbench::find_preset(opt.preset);  // a known name: checked by CLI11
  dg::AttentionSpec spec = dgbench::spec_of(*preset);
  if (opt.q_heads) spec.num_q_heads = opt.q_heads;
  if (opt.kv_heads) spec.num_kv_heads = opt.kv_heads;
  if (opt.head_size) spec.head_size = opt.head_size;
  if (opt.block_size) spec.block_size = opt.block_size;
  if (!opt.dtype.empty()) spec.dtype = dg::parse_dtype(opt.dtype);
  if (!opt.layout.empty()) spec.layout = dg::parse_layout(opt.layout);
  dg::validate_spec(spec);
  if (!opt.batch) opt.batch = gpu ? 8 : 4;
  def("--batch", std::to_string(opt.batch));
  if (!opt.layers) opt.layers = gpu ? 32 : 2;
  def("--layers", std::to_string(opt.layers));
  if (!opt.steps) opt.steps = gpu ? 64 : 48;
  def("--steps", std::to_string(opt.steps));
  if (opt.start_lens.empty())
    opt.start_lens = gpu ? "400:480,1990:2030,4040:4090,8150:8180,30000:32000" : "400:480,1990:2030,4070:4090,8170:8180";
  def("--start-lens", opt.start_lens);
  def("--backend", opt.backend + " -> " + dg::to_string(backend));
  def("--partition", opt.partition);
  def("--threshold", std::to_string(opt.threshold));
  def("--policy", opt.policy);
  def("--band-select", opt.band_select);

  const std::vector<Segment> segments = parse_segments(opt.start_lens, opt.batch);
  const int bs = spec.block_size;
  int longest = 0;
  long long max_blocks_needed = 0;
  for (const auto& s : segments) {
    long long blocks = 0;
    for (int len : s.start) {
      longest = std::max(longest, len + opt.steps);
      blocks += (len + opt.steps + bs - 1) / bs;
    }
    max_blocks_needed = std::max(max_blocks_needed, blocks);
  }
  if (!opt.max_seq_len) {
    opt.max_seq_len = 1024;
    while (opt.max_seq_len < longest) opt.max_seq_len *= 2;
  }
  def("--max-seq-len", std::to_string(opt.max_seq_len));
  if (longest > opt.max_seq_len)
    usage_error(fmt::format("--max-seq-len = {} is below the longest length the run reaches ({})", opt.max_seq_len,
                            longest));
  const int partition = opt.partition == "auto" ? 0 : std::stoi(opt.partition);  // checked by CLI11

  // What planning reads; the run adds its caches and layers below.
  dg::ExecutorConfig cfg;
  cfg.spec = spec;
  cfg.max_batch = opt.batch;
  cfg.max_seq_len = opt.max_seq_len;
  cfg.v2_threshold = opt.threshold;
  cfg.partition_size = partition;
  cfg.policy = dg::parse_kernel_policy(opt.policy);
  cfg.band_select = opt.band_select == "host" ? dg::BandSelect::kHost : dg::BandSelect::kDevice;
  if (!opt.device_model.empty()) cfg.device_model = parse_device_model(opt.device_model);
  const std::string model_from = model_source(opt.device_model, gpu);
  if (opt.plan_only) return plan_only(opt, cfg, defaults_used, out);

  const int num_blocks = static_cast<int>(std::max<long long>(1, max_blocks_needed));
  const int width = (opt.max_seq_len + bs - 1) / bs;  // block-table row width
  const std::size_t esize = dg::dtype_size(spec.dtype);
  const std::size_t cache_elems = static_cast<std::size_t>(num_blocks) * spec.block_elems();
  const std::size_t qo_elems = static_cast<std::size_t>(opt.batch) * spec.num_q_heads * spec.head_size;
  const std::size_t kv_row_elems = static_cast<std::size_t>(opt.batch) * spec.num_kv_heads * spec.head_size;

  fmt::print(out, "decodegraph {} decode_loop\n", dg::version());
  std::string device_name = "CPU";
  dgbench::ReadBandwidth rbw, cbw;
#if DECODEGRAPH_HAS_CUDA
  if (gpu) {
    int dev = 0;
    DGB_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    DGB_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    device_name = prop.name;
    rbw = dgbench::measure_read_bandwidth(dgbench::default_bandwidth_buffer_bytes(), 20);
    cbw = dgbench::measure_copy_bandwidth(dgbench::default_bandwidth_buffer_bytes(), 10);
    fmt::print(out, "backend: cuda on {} ({} SMs); timings are GPU wall-clock per step (host launch + device)\n",
               prop.name, prop.multiProcessorCount);
    fmt::print(out, "measured read bandwidth: {:.0f} GB/s (median of {} streaming reads of {}; best {:.0f} GB/s)\n",
               rbw.median_gbs, rbw.iterations, dgbench::format_bytes(static_cast<double>(rbw.buffer_bytes)),
               rbw.best_gbs);
    fmt::print(out, "measured d2d copy bandwidth: {:.0f} GB/s read + write (median of {} copies of {})\n",
               cbw.median_gbs, cbw.iterations, dgbench::format_bytes(static_cast<double>(cbw.buffer_bytes)));
  }
#endif
  if (!gpu) {
    fmt::print(out,
               "backend: host ({}). All timings are CPU timings of the host backend, NOT GPU timings;\n"
               "GB/s against device bandwidth is not applicable (n/a). Graph replay and eager run the\n"
               "same host implementation here, so expect a speedup near 1.0x.\n",
               dg::cuda_device_available() ? "chosen with --backend host" : "no CUDA device present");
  }
  if (!defaults_used.empty()) {
    fmt::print(out, "defaults used:");
    for (const auto& d : defaults_used) fmt::print(out, " {};", d);
    fmt::print(out, "\n");
  }
  fmt::print(out, "shape: {} q heads, {} kv heads, head {}, block {}, {}, layout {}; batch {}, {} layers, {} steps x {} "
             "segments\n",
             spec.num_q_heads, spec.num_kv_heads, spec.head_size, spec.block_size, dg::to_string(spec.dtype),
             dg::to_string(spec.layout), opt.batch, opt.layers, opt.steps, segments.size());
  fmt::print(out, "KV cache: {} blocks x {} layers = {}\n\n", num_blocks, opt.layers,
             dgbench::format_bytes(2.0 * static_cast<double>(cache_elems * esize) * opt.layers));

  // Caches, random and never zero.
  std::vector<Buffer> k_caches, v_caches, eager_out;
  for (int l = 0; l < opt.layers; ++l) {
    k_caches.emplace_back(gpu, cache_elems * esize);
    v_caches.emplace_back(gpu, cache_elems * esize);
    eager_out.emplace_back(gpu, qo_elems * esize);
  }
  auto fill = [&](void* p, std::size_t n, std::uint64_t seed) {
#if DECODEGRAPH_HAS_CUDA
    if (gpu) {
      dgbench::fill_random_device(spec.dtype, p, n, seed, nullptr);
      return;
    }
#endif
    dgbench::fill_random_host(spec.dtype, p, n, seed);
  };
  for (int l = 0; l < opt.layers; ++l) {
    fill(k_caches[l].get(), cache_elems, opt.seed * 1000 + 2 * l);
    fill(v_caches[l].get(), cache_elems, opt.seed * 1000 + 2 * l + 1);
  }
#if DECODEGRAPH_HAS_CUDA
  if (gpu) DGB_CUDA_CHECK(cudaDeviceSynchronize());
#endif

  cfg.num_layers = opt.layers;
  for (int l = 0; l < opt.layers; ++l) {
    dg::LayerBuffers lb;
    lb.k_cache = k_caches[l].get();
    lb.v_cache = v_caches[l].get();
    cfg.layers.push_back(lb);
  }
  cfg.num_blocks = num_blocks;
  cfg.max_blocks_per_seq = width;
  cfg.capture = opt.capture == "up-front" ? dg::CapturePolicy::kUpFront : dg::CapturePolicy::kLazy;
  cfg.backend = backend;
  cfg.append_kv = true;
  dg::Executor ex(cfg);
  const dg::Stream stream = ex.stream();

  const dg::DeviceModel model = ex.config().device_model;
  fmt::print(out, "policy {}; device model {} SMs x {} resident pass-1 blocks = {} slots ({})\n", opt.policy,
             model.num_sms, model.blocks_per_sm, model.target_blocks(),
             model_from);
  fmt::print(out, "band select: {}{}\n", dg::to_string(ex.band_select()),
             ex.band_select() == dg::BandSelect::kDevice
                 ? " (one graph per batch bucket; the band is chosen in the graph, a SWITCH node per layer)"
                 : (ex.stats().band_select_note.empty() ? " (one graph per distinct plan)"
                                                        : " (" + ex.stats().band_select_note + ")"));
  fmt::print(out, "plan (every bucket; this run uses batch bucket {}; {} distinct graphs for {} buckets{}):\n{}\n",
             opt.batch, ex.stats().distinct_graphs, ex.plans().size(),
             cfg.policy == dg::KernelPolicy::kMeasured ? ", kMeasured: decided when each bucket is first captured"
                                                       : "",
             ex.plan_table());
  dg::ExecutorConfig model_cfg = cfg;  // kAuto and kThreshold side by side, on the executor's device model
  model_cfg.device_model = model;
  const std::vector<PolicyRow> policy_rows = compare_policies(model_cfg, opt.batch);

  // Eager-side buffers: staged inputs and V2 workspace sized for the largest plan.
  Buffer d_lens(gpu, sizeof(int32_t) * opt.batch), d_tables(gpu, sizeof(int32_t) * opt.batch * width),
      d_slots(gpu, sizeof(int64_t) * opt.batch);
  // The executor's workspace covers every plan of the run's batch bucket, and every kMeasured candidate.
  Buffer workspace(gpu, ex.memory().workspace);
  HostArray<int32_t> lens(gpu, opt.batch), tables(gpu, static_cast<std::size_t>(opt.batch) * width);
  HostArray<int64_t> slots(gpu, opt.batch);
  std::vector<unsigned char> host_graph_out(qo_elems * esize), host_eager_out(qo_elems * esize);

  auto sync = [&]() {
#if DECODEGRAPH_HAS_CUDA
    if (gpu) DGB_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
#endif
  };
  auto to_device_async = [&](void* dst, const void* src, std::size_t bytes) {
#if DECODEGRAPH_HAS_CUDA
    if (gpu) {
      DGB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, reinterpret_cast<cudaStream_t>(stream)));
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  };
  auto to_host = [&](void* dst, const void* src, std::size_t bytes) {
#if DECODEGRAPH_HAS_CUDA
    if (gpu) {
      DGB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  };
  auto fill_async = [&](void* p, std::size_t n, std::uint64_t seed) {
#if DECODEGRAPH_HAS_CUDA
    if (gpu) {
      dgbench::fill_random_device(spec.dtype, p, n, seed, reinterpret_cast<cudaStream_t>(stream));
      return;
    }
#endif
    dgbench::fill_random_host(spec.dtype, p, n, seed);
  };
  using Clock = std::chrono::steady_clock;
  auto us_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  };

  const Tolerance tol = tolerance_for(spec.dtype);
  std::vector<StepRecord> recs;
  std::vector<std::string> mismatches;
  long mismatch_steps = 0;
  int ref_checks = 0;
  double ref_max_err = 0;
  bool ref_failed = false;
  std::mt19937_64 rng(opt.seed);
  Progress progress(opt.progress, static_cast<long>(segments.size()) * opt.steps);
  const auto run_start = Clock::now();
  double capture_wall_ms = 0;

  for (std::size_t si = 0; si < segments.size(); ++si) {
    const Segment& seg = segments[si];
    // A fresh shuffled free list per segment: block tables are scattered, as in a real cache.
    std::vector<int32_t> free_blocks(static_cast<std::size_t>(num_blocks));
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    std::size_t next_free = 0;
    std::vector<int> allocated(static_cast<std::size_t>(opt.batch), 0);
    std::fill(tables.data(), tables.data() + tables.size(), 0);
    for (int i = 0; i < opt.batch; ++i) {
      lens[i] = seg.start[i];
      const int need = (seg.start[i] + bs - 1) / bs;
      for (int b = 0; b < need; ++b) tables[static_cast<std::size_t>(i) * width + b] = free_blocks[next_free++];
      allocated[i] = need;
    }
    int last_band = -1;
    for (int st = 0; st < opt.steps; ++st) {
      // Grow every sequence by one token; a token that starts a block gets a new block.
      int max_len = 0;
      for (int i = 0; i < opt.batch; ++i) {
        const int pos = lens[i];
        const int blk = pos / bs;
        if (blk >= allocated[i]) {
          tables[static_cast<std::size_t>(i) * width + blk] = free_blocks[next_free++];
          allocated[i] = blk + 1;
        }
        slots[i] = static_cast<int64_t>(tables[static_cast<std::size_t>(i) * width + blk]) * bs + pos % bs;
        lens[i] = pos + 1;
        max_len = std::max(max_len, pos + 1);
      }
      // This step's q and new K/V (what the model's projections would produce), random per step.
      const std::uint64_t step_seed = opt.seed * 7919 + si * 100003 + static_cast<std::uint64_t>(st) * 31;
      for (int l = 0; l < opt.layers; ++l) {
        fill_async(ex.query(l), qo_elems, step_seed + 3 * l);
        fill_async(ex.new_key(l), kv_row_elems, step_seed + 3 * l + 1);
        fill_async(ex.new_value(l), kv_row_elems, step_seed + 3 * l + 2);
      }
      sync();

      // Graph: validate, bucket, stage, replay (capture first when the bucket is new).
      dg::StepInputs in;
      in.num_seqs = opt.batch;
      in.seq_lens = lens.data();
      in.block_tables = tables.data();
      in.block_table_stride = width;
      in.slot_mapping = slots.data();
      in.space = dg::MemorySpace::kHost;
      auto t0 = Clock::now();
      const dg::StepResult r = ex.step(in);
      sync();
      const double graph_us = us_since(t0);
      if (r.captured || r.measured) capture_wall_ms += graph_us / 1000.0;

      // Eager: the same work launched call by call, with the plan's kernel and partition size. It
      // appends the same K/V into the same slots (idempotent), so both see identical caches.
      t0 = Clock::now();
      to_device_async(d_lens.get(), lens.data(), sizeof(int32_t) * opt.batch);
      to_device_async(d_tables.get(), tables.data(), sizeof(int32_t) * opt.batch * width);
      to_device_async(d_slots.get(), slots.data(), sizeof(int64_t) * opt.batch);
      for (int l = 0; l < opt.layers; ++l) {
        dg::AppendArgs ap;
        ap.spec = spec;
        ap.num_tokens = opt.batch;
        ap.num_blocks = num_blocks;
        ap.key = ex.new_key(l);
        ap.value = ex.new_value(l);
        ap.k_cache = k_caches[l].get();
        ap.v_cache = v_caches[l].get();
        ap.slot_mapping = static_cast<const int64_t*>(d_slots.get());
        dg::DecodeArgs a;
        a.spec = spec;
        a.num_seqs = opt.batch;
        a.max_seq_len = max_len;  // what an eager caller knows; the graph uses its band's upper edge
        a.block_table_stride = width;
        a.num_blocks = num_blocks;
        a.q = ex.query(l);
        a.out = eager_out[l].get();
        a.k_cache = k_caches[l].get();
        a.v_cache = v_caches[l].get();
        a.block_tables = static_cast<const int32_t*>(d_tables.get());
        a.seq_lens = static_cast<const int32_t*>(d_lens.get());
        a.host_seq_lens = lens.data();
        if (gpu) {
          dg::append_kv(ap, stream);
          if (r.kernel == dg::KernelKind::kV1) dg::paged_attention_v1(a, stream);
          else dg::paged_attention_v2(a, r.partition_size, workspace.get(), workspace.bytes(), stream);
        } else {
          dg::host::append_kv(ap);
          if (r.kernel == dg::KernelKind::kV1) dg::host::paged_attention_v1(a);
          else dg::host::paged_attention_v2(a, r.partition_size, workspace.get(), workspace.bytes());
        }
      }
      sync();
      const double eager_us = us_since(t0);

      StepRecord rec;
      rec.segment = static_cast<int>(si);
      rec.step = st;
      rec.band = r.band;
      rec.band_hi = r.band_hi;
      rec.kernel = r.kernel;
      rec.partition_size = r.partition_size;
      rec.captured = r.captured;
      rec.measured = r.measured;
      rec.graph_id = r.graph_id;
      rec.max_len = max_len;
      rec.eager_us = eager_us;
      rec.graph_us = graph_us;
      rec.bytes = opt.layers * dgbench::attention_bytes(spec, lens.data(), opt.batch, r.kernel, r.partition_size);
      for (const auto& p : ex.plans())
        if (p.band == r.band) rec.band_lo = p.band_lo;

      if (opt.check) {
        for (int l = 0; l < opt.layers; ++l) {
          to_host(host_graph_out.data(), ex.output(l), qo_elems * esize);
          to_host(host_eager_out.data(), eager_out[l].get(), qo_elems * esize);
          const bool same = std::memcmp(host_graph_out.data(), host_eager_out.data(), qo_elems * esize) == 0;
          double worst = 0;
          std::size_t worst_i = 0;
          bool out_of_tol = false;
          for (std::size_t i = 0; i < qo_elems && !same; ++i) {
            const double g = dg::load_as_float(spec.dtype, host_graph_out.data(), i);
            const double e = dg::load_as_float(spec.dtype, host_eager_out.data(), i);
            const double d = std::isnan(g) || std::isnan(e) ? INFINITY : std::fabs(g - e);
            if (d > worst) worst = d, worst_i = i;
            if (d > tol.atol + tol.rtol * std::fabs(e)) out_of_tol = true;
          }
          rec.bitwise_equal = rec.bitwise_equal && same;
          rec.max_abs_diff = std::max(rec.max_abs_diff, worst);
          const bool bad = gpu ? !same : out_of_tol;
          if (bad) {
            if (mismatches.size() < 5)
              mismatches.push_back(fmt::format("segment {} step {} layer {} ({}, band {}): graph and eager differ; "
                                               "max |diff| {:.3g} at element {}{}",
                                               si, st, l, dg::to_string(r.kernel), band_label(rec.band_lo, r.band_hi),
                                               worst, worst_i, gpu ? " (bitwise equality required on GPU)" : ""));
            ++mismatch_steps;
          }
        }
        // Host backend: also against the float64 reference, on each segment's first step and at every
        // band change (cheap enough there; on GPU the test suites do this).
        if (!gpu && (st == 0 || r.band != last_band)) {
          dg::DecodeArgs a;
          a.spec = spec;
          a.num_seqs = opt.batch;
          a.max_seq_len = max_len;
          a.block_table_stride = width;
          a.num_blocks = num_blocks;
          a.q = ex.query(0);
          a.out = ex.output(0);  // validated as an argument; the reference writes only ref
          a.k_cache = k_caches[0].get();
          a.v_cache = v_caches[0].get();
          a.block_tables = tables.data();
          a.seq_lens = lens.data();
          std::vector<double> ref(qo_elems);
          dg::reference::paged_attention(a, ref.data());
          for (std::size_t i = 0; i < qo_elems; ++i) {
            const double g = dg::load_as_float(spec.dtype, ex.output(0), i);
            const double d = std::isnan(g) ? INFINITY : std::fabs(g - ref[i]);
            ref_max_err = std::max(ref_max_err, d);
            if (d > tol.atol + tol.rtol * std::fabs(ref[i])) ref_failed = true;
          }
          ++ref_checks;
        }
      }
      last_band = r.band;
      recs.push_back(rec);
      progress.update(static_cast<long>(recs.size()),
                      fmt::format("len {} {}", max_len, dg::to_string(r.kernel)));
    }
  }
  progress.finish();
  const double run_s = std::chrono::duration<double>(Clock::now() - run_start).count();

  // ---------------------------------------------------------------- report
  const double bw = gpu ? rbw.median_gbs : 0;
  const std::vector<BandRow> rows = band_rows(recs, bw, gpu ? cbw.median_gbs : 0);
  std::vector<std::vector<std::string>> table = {{"band", "kernel", "P", "steps", "eager p50 us", "eager p99 us",
                                                  "graph p50 us", "graph p99 us", "speedup", "GB/s", "% read bw",
                                                  "% copy bw"}};
  for (const auto& b : rows) {
    const bool timed = b.timed_steps > 0;
    table.push_back({band_label(b.band_lo, b.band_hi), dg::to_string(b.kernel),
                     b.kernel == dg::KernelKind::kV2 ? std::to_string(b.partition_size) : "-",
                     b.timed_steps == b.steps ? std::to_string(b.steps) : fmt::format("{} ({})", b.steps, b.timed_steps),
                     fmt::format("{:.1f}", b.eager_p50), fmt::format("{:.1f}", b.eager_p99),
                     timed ? fmt::format("{:.1f}", b.graph_p50) : "-", timed ? fmt::format("{:.1f}", b.graph_p99) : "-",
                     timed ? fmt::format("{:.2f}x", b.speedup) : "-", timed ? fmt::format("{:.1f}", b.gbs) : "-",
                     b.pct_read_bw >= 0 ? fmt::format("{:.1f}%", b.pct_read_bw) : "n/a",
                     b.pct_copy_bw >= 0 ? fmt::format("{:.1f}%", b.pct_copy_bw) : "n/a"});
  }
  fmt::print(out, "per band (batch bucket {}, {} layers; {}):\n", opt.batch, opt.layers,
             gpu ? "GPU wall-clock per step, host launch through device completion" : "CPU timings of the host backend");
  fmt::print(out, "{}", dgbench::format_table(table));
  fmt::print(out,
             "  steps \"N (M)\": M of N steps timed for graph; the others captured the bucket's graph or timed "
             "its candidates (see captures below).\n"
             "  GB/s = bytes per step by the bytes model of docs/design.md (K+V read, q, out, V2 partials) / graph "
             "p50.\n");
  if (!gpu) fmt::print(out, "  % read bw, % copy bw: n/a on the host backend (no device bandwidth to compare with).\n");
  fmt::print(out,
             "\nkAuto and kThreshold per band (batch bucket {}; {} slots; this run: --policy {}):\n{}"
             "  The swap: above the threshold ({}) every policy replays V2. At or below it kThreshold runs V1,\n"
             "  one block per (sequence, KV head), while kAuto runs V1 only where that fills the {} resident\n"
             "  slots, and otherwise V2 with enough balanced partitions to fill them at the band's lower edge.\n",
             opt.batch, model.target_blocks(), opt.policy, policies_table(policy_rows), opt.threshold,
             model.target_blocks());
  if (opt.csv) {
    fmt::print("band_lo,band_hi,kernel,partition_size,steps,timed_steps,eager_p50_us,eager_p99_us,graph_p50_us,"
               "graph_p99_us,speedup,bytes_per_step,gbs,pct_read_bw,pct_copy_bw\n");
    for (const auto& b : rows)
      fmt::print("{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.4f},{:.0f},{:.3f},{},{}\n", b.band_lo, b.band_hi,
                 dg::to_string(b.kernel), b.partition_size, b.steps, b.timed_steps, b.eager_p50, b.eager_p99,
                 b.graph_p50, b.graph_p99, b.speedup, b.bytes_per_step, b.gbs,
                 b.pct_read_bw >= 0 ? fmt::format("{:.2f}", b.pct_read_bw) : "n/a",
                 b.pct_copy_bw >= 0 ? fmt::format("{:.2f}", b.pct_copy_bw) : "n/a");
  }

  const dg::ExecutorStats stats = ex.stats();
  const dg::MemoryReport mem = ex.memory();
  std::vector<std::vector<std::string>> ctable = {{"graph", "bucket", "lengths", "buckets", "kernel", "captures",
                                                   "replays", "nodes", "capture ms", "instantiate ms", "measure ms"}};
  for (const auto& g : stats.graphs)
    ctable.push_back({std::to_string(g.graph_id), std::to_string(g.batch), band_label(g.band_lo, g.band_hi),
                      std::to_string(g.buckets),
                      g.switch_graph ? fmt::format("switch, {} branches", g.branches)
                      : g.kernel == dg::KernelKind::kV2 ? fmt::format("v2 P={}", g.partition_size)
                                                        : "v1",
                      std::to_string(g.captures), std::to_string(g.replays), std::to_string(g.nodes),
                      fmt::format("{:.2f}", g.capture_ms), fmt::format("{:.2f}", g.instantiate_ms),
                      fmt::format("{:.2f}", g.measure_ms)});
  fmt::print(out,
             "\ncaptures: {} graphs captured of {} distinct for {} buckets; capture {:.2f} ms + instantiate {:.2f} "
             "ms in total ({:.2f} ms wall in the capturing steps)\n",
             stats.total_captures, stats.distinct_graphs, stats.buckets, stats.capture_ms, stats.instantiate_ms,
             capture_wall_ms);
  if (cfg.policy == dg::KernelPolicy::kMeasured)
    fmt::print(out, "measuring (kMeasured): {} buckets, {} candidate graphs timed, {:.2f} ms\n",
               stats.measured_buckets, stats.candidate_graphs, stats.measure_ms);
  fmt::print(out, "{}", dgbench::format_table(ctable));
  fmt::print(out, "memory: static buffers {}, V2 workspace {}, graphs {}, total {}{}\n",
             dgbench::format_bytes(static_cast<double>(mem.static_buffers)),
             dgbench::format_bytes(static_cast<double>(mem.workspace)),
             dgbench::format_bytes(static_cast<double>(mem.graphs)), dgbench::format_bytes(static_cast<double>(mem.total())),
             gpu ? "" : " (host memory; graphs: n/a on host)");
  fmt::print(out, "steps: {} replayed ({} V1, {} V2), {} rejected\n", stats.steps, stats.replays(dg::KernelKind::kV1),
             stats.replays(dg::KernelKind::kV2), stats.rejected_steps);

  // Capture cost of the two band choices side by side: every bucket captured up front by one more
  // executor each, on the same caches. kMeasured would time every candidate of every bucket first.
  std::vector<CaptureCost> costs;
  if (cfg.policy != dg::KernelPolicy::kMeasured) {
    for (const dg::BandSelect mode : {dg::BandSelect::kHost, dg::BandSelect::kDevice}) costs.push_back(capture_cost(cfg, mode));
    std::vector<std::vector<std::string>> t = {
        {"band select", "graphs", "buckets", "distinct plans", "nodes", "capture ms", "instantiate ms", "graph memory"}};
    for (const CaptureCost& c : costs)
      t.push_back({c.mode, std::to_string(c.graphs), std::to_string(c.buckets), std::to_string(c.distinct_plans),
                   std::to_string(c.nodes), fmt::format("{:.2f}", c.capture_ms), fmt::format("{:.2f}", c.instantiate_ms),
                   gpu ? dgbench::format_bytes(static_cast<double>(c.graph_bytes)) : "n/a (host)"});
    fmt::print(out, "\ncapture cost, every bucket captured up front (kHost: one graph per distinct plan; kDevice: one "
                    "per batch bucket){}:\n{}",
               costs.back().mode == "device" ? "" : " (kDevice fell back: " + costs.back().note + ")",
               dgbench::format_table(t));
  } else {
    fmt::print(out, "\ncapture cost side by side: not computed under --policy measured (it would time every candidate "
                    "of every bucket first)\n");
  }

  int bitwise_steps = 0;
  double max_diff = 0;
  for (const auto& r : recs) {
    bitwise_steps += r.bitwise_equal ? 1 : 0;
    max_diff = std::max(max_diff, r.max_abs_diff);
  }
  if (opt.check) {
    fmt::print(out, "check: eager vs graph over {} steps x {} layers: {} steps bitwise equal, max |diff| {:.3g} ({})\n",
               recs.size(), opt.layers, bitwise_steps, max_diff,
               gpu ? "bitwise equality required" : fmt::format("tolerance atol {:.0e} rtol {:.0e}", tol.atol, tol.rtol));
    if (!gpu)
      fmt::print(out, "check: graph vs float64 reference (layer 0) at {} steps: max |err| {:.3g} ({})\n", ref_checks,
                 ref_max_err, ref_failed ? "OUT OF TOLERANCE" : "within tolerance");
  } else {
    fmt::print(out, "check: skipped (--no-check)\n");
  }
  fmt::print(out, "wall time of the loop: {:.1f} s\n", run_s);

  if (!opt.json_path.empty()) {
    json j;
    j["program"] = "decode_loop";
    j["version"] = dg::version();
    j["backend"] = dg::to_string(backend);
    j["device"] = device_name;
    j["timing"] = gpu ? "gpu-wallclock" : "cpu-host-backend";
    j["read_bandwidth_gbs"] = num_or_null(rbw.median_gbs, gpu);
    j["copy_bandwidth_gbs"] = num_or_null(cbw.median_gbs, gpu);
    j["config"] = {{"preset", opt.preset},
                   {"q_heads", spec.num_q_heads},
                   {"kv_heads", spec.num_kv_heads},
                   {"head_size", spec.head_size},
                   {"block_size", spec.block_size},
                   {"dtype", dg::to_string(spec.dtype)},
                   {"layout", dg::to_string(spec.layout)},
                   {"batch", opt.batch},
                   {"layers", opt.layers},
                   {"steps", opt.steps},
                   {"start_lens", opt.start_lens},
                   {"max_seq_len", opt.max_seq_len},
                   {"threshold", opt.threshold},
                   {"partition", opt.partition},
                   {"policy", opt.policy},
                   {"device_model", opt.device_model},
                   {"capture", opt.capture},
                   {"seed", opt.seed}};
    j["defaults_used"] = defaults_used;
    j["policy"] = opt.policy;
    j["device_model"] = device_model_json(
        model, model_from);
    j["plans"] = plans_json(ex.plans());
    j["policies"] = policies_json(policy_rows);
    json& jb = j["bands"] = json::array();
    for (const auto& b : rows) {
      const bool timed = b.timed_steps > 0;
      jb.push_back({{"band", b.band},
                    {"band_lo", b.band_lo},
                    {"band_hi", b.band_hi},
                    {"kernel", dg::to_string(b.kernel)},
                    {"partition_size", b.partition_size},
                    {"steps", b.steps},
                    {"timed_steps", b.timed_steps},
                    {"eager_p50_us", num_or_null(b.eager_p50)},
                    {"eager_p99_us", num_or_null(b.eager_p99)},
                    {"graph_p50_us", num_or_null(b.graph_p50, timed)},
                    {"graph_p99_us", num_or_null(b.graph_p99, timed)},
                    {"speedup", num_or_null(b.speedup, timed)},
                    {"bytes_per_step", num_or_null(b.bytes_per_step)},
                    {"gbs", num_or_null(b.gbs)},
                    {"pct_read_bw", num_or_null(b.pct_read_bw, b.pct_read_bw >= 0)},
                    {"pct_copy_bw", num_or_null(b.pct_copy_bw, b.pct_copy_bw >= 0)},
                    {"max_abs_diff", num_or_null(b.max_abs_diff)}});
    }
    json jg = json::array();
    for (const auto& g : stats.graphs)
      jg.push_back({{"graph_id", g.graph_id},
                    {"batch", g.batch},
                    {"band", g.band},
                    {"last_band", g.last_band},
                    {"band_lo", g.band_lo},
                    {"band_hi", g.band_hi},
                    {"buckets", g.buckets},
                    {"kernel", dg::to_string(g.kernel)},
                    {"partition_size", g.partition_size},
                    {"captures", g.captures},
                    {"replays", g.replays},
                    {"nodes", g.nodes},
                    {"capture_ms", g.capture_ms},
                    {"instantiate_ms", g.instantiate_ms},
                    {"measure_ms", g.measure_ms}});
    j["captures"] = {{"total", stats.total_captures},
                     {"buckets", stats.buckets},
                     {"distinct_graphs", stats.distinct_graphs},
                     {"capture_ms", stats.capture_ms},
                     {"instantiate_ms", stats.instantiate_ms},
                     {"measure_ms", stats.measure_ms},
                     {"measured_buckets", stats.measured_buckets},
                     {"candidate_graphs", stats.candidate_graphs},
                     {"graphs", jg}};
    json jc = json::array();
    for (const CaptureCost& c : costs)
      jc.push_back({{"band_select", c.mode},
                    {"graphs", c.graphs},
                    {"buckets", c.buckets},
                    {"distinct_plans", c.distinct_plans},
                    {"nodes", c.nodes},
                    {"capture_ms", c.capture_ms},
                    {"instantiate_ms", c.instantiate_ms},
                    {"graph_bytes", c.graph_bytes},
                    {"note", c.note}});
    j["capture_compare"] = jc;
    j["band_select"] = dg::to_string(ex.band_select());
    j["memory"] = {{"static_buffers", mem.static_buffers},
                   {"workspace", mem.workspace},
                   {"graphs", mem.graphs},
                   {"total", mem.total()}};
    j["check"] = {{"enabled", opt.check},
                  {"mismatch_steps", mismatch_steps},
                  {"bitwise_equal_steps", bitwise_steps},
                  {"max_abs_diff", num_or_null(max_diff)},
                  {"reference_checks", ref_checks},
                  {"reference_max_err", num_or_null(ref_max_err)}};
    j["wall_s"] = run_s;
    json& js = j["steps"] = json::array();
    for (const auto& r : recs)
      js.push_back({{"segment", r.segment},
                    {"step", r.step},
                    {"band", r.band},
                    {"kernel", dg::to_string(r.kernel)},
                    {"partition_size", r.partition_size},
                    {"captured", r.captured},
                    {"measured", r.measured},
                    {"graph_id", r.graph_id},
                    {"max_len", r.max_len},
                    {"bytes", num_or_null(r.bytes)},
                    {"eager_us", num_or_null(r.eager_us)},
                    {"graph_us", num_or_null(r.graph_us)}});
    write_json(opt.json_path, j);
    fmt::print(out, "json: {}\n", opt.json_path);
  }

  if (mismatch_steps > 0 || ref_failed) {
    fmt::print(stderr, "\nFAILED: {} layer-steps where eager and graph outputs disagree{}\n", mismatch_steps,
               ref_failed ? "; graph output out of tolerance against the float64 reference" : "");
    for (const auto& m : mismatches) fmt::print(stderr, "  {}\n", m);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    fmt::print(stderr, "decode_loop: {}\n(run decode_loop --help for the options)\n", e.what());
    return 2;
  } catch (const dg::Error& e) {
    fmt::print(stderr, "decode_loop: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "decode_loop: unexpected error: {}\n", e.what());
    return 2;
  }
}
