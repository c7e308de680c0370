// GPU attention benchmarks: eager launches against graph replay, side by side, on named axes.
//
//   model    llama3-8b (32q/8kv), llama3-70b-tp8 (8q/1kv), mha (32q/32kv); head 128, block 16, bf16
//   kv       the KV cache dtype (vLLM's kv_cache_dtype): auto (bf16), fp8_e4m3, fp8_e5m2 (scales
//            1/256 in device memory; the bytes model counts one byte per cached value)
//   layers   1, 32 (each layer its own KV cache)
//   batch    1, 8, 32, 64, 128
//   context  512, 1K, 2K, 4K, 8K, 8193, 16K, 32K, 64K, 128K (every sequence at this length)
//   mode     eager_v1; eager_v2_p512, eager_v2_p1024; eager_plan (the executor's plan for this bucket,
//            kernel and P, launched eagerly: the same launches the graph replays);
//            graph (Executor::step, attention-only) and graph_callback (the same work enqueued by a
//            step body through StepContext::attention)
//   kernel   new (the library's pass 1) for every mode; legacy (the pass 1 before the cp.async
//            rewrite, kernels/legacy/, bf16/fp16 at head 128) for the eager modes, so old and new
//            run side by side in one process (e.g. --benchmark_filter=context:32768/.*eager_plan)
//
// One iteration = one decode step over all layers. Timing: the stream is idle at the start of each
// iteration; CUDA events bracket the step (for the graph modes that includes step()'s host work and
// staging, since the start event completes at once on an idle stream). Counters:
//   us_per_step   median over iterations (Google Benchmark's own time column is the mean); us_p99
//   kernel_v2, P  the kernel (0 = V1, 1 = V2) and partition size that ran
//   bytes         docs/design.md's bytes model for the step (all layers)
//   GBps          bytes / median
//   pct_read_bw   GBps / the device read bandwidth measured by bench/bandwidth.cu in this process
//   pct_copy_bw   GBps / the device-to-device copy bandwidth (read + write) measured in this process
// Honest timing: warm-up steps first; the KV footprint of the working set is kept >= 256 MB (5x the
// H200's 50 MB L2) by rotating each step through several copies of the block tables, each pointing at
// its own blocks. Combos needing more than 100 GB are not registered.
// Without a CUDA device every benchmark reports SkipWithError("no CUDA device").
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "kernels/legacy/legacy.hpp"

namespace dg = decodegraph;

namespace {

constexpr double kMaxBytes = 100e9;          // skip combos whose KV would not fit in ~100 GB
constexpr double kMinFootprint = 256.0e6;    // >= 5x the H200's L2 per step cycle
constexpr int kMaxRotations = 64;

enum class Mode { kEagerV1, kEagerV2P512, kEagerV2P1024, kEagerPlan, kGraph, kGraphCallback };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kEagerV1: return "eager_v1";
    case Mode::kEagerV2P512: return "eager_v2_p512";
    case Mode::kEagerV2P1024: return "eager_v2_p1024";
    case Mode::kEagerPlan: return "eager_plan";
    case Mode::kGraph: return "graph";
    case Mode::kGraphCallback: return "graph_callback";
  }
  return "?";
}

struct Combo {
  const dgbench::ModelPreset* model;
  dg::KVCacheDType kv;
  int layers, batch, context;
  int rotations;
  double total_bytes;  // KV bytes allocated
};

int rotations_for(const dg::AttentionSpec& spec, int layers, int batch, int context) {
  const double per_set = layers * batch * dgbench::kv_bytes(spec, context);
  return std::clamp(static_cast<int>(std::ceil(kMinFootprint / per_set)), 1, kMaxRotations);
}

// ---------------------------------------------------------------- device read bandwidth (once)

double read_bandwidth_gbs() {
  static double gbs = [] {
    const dgbench::ReadBandwidth r =
        dgbench::measure_read_bandwidth(dgbench::default_bandwidth_buffer_bytes(), 20);
    return r.median_gbs;
  }();
  return gbs;
}

double copy_bandwidth_gbs() {
  static double gbs = [] {
    return dgbench::measure_copy_bandwidth(dgbench::default_bandwidth_buffer_bytes(), 10).median_gbs;
  }();
  return gbs;
}

// ---------------------------------------------------------------- the workload of one combo

/// Caches, block tables and executors for one (model, layers, batch, context); shared by the modes,
/// which run one after another, so they are built once per combo.
struct Workload {
  Combo combo;
  dg::AttentionSpec spec;
  int width = 0;
  int num_blocks = 0;
  cudaStream_t stream = nullptr;
  std::vector<void*> device;  // every cudaMalloc, freed in the destructor
  std::vector<void*> k, v, q, out;
  float* scales = nullptr;  // fp8: [num_kv_heads] of dgbench::kFillKvScale, K and V alike
  std::vector<int32_t*> d_tables;  // [rotations] each [batch, width], slices of one allocation
  int32_t* d_lens = nullptr;
  int32_t* h_lens = nullptr;                 // pinned
  std::vector<int32_t*> h_tables;            // pinned, [rotations]
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  std::unique_ptr<dg::Executor> graph, callback;
  std::optional<dg::BucketPlan> plan_;

  void* dmalloc(std::size_t bytes) {
    void* p = nullptr;
    DGB_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)));
    device.push_back(p);
    return p;
  }

  static dg::AttentionSpec spec_of(const Combo& c) {
    dg::AttentionSpec s = dgbench::spec_of(*c.model);
    s.kv_dtype = c.kv;
    return s;
  }

  explicit Workload(const Combo& c) : combo(c), spec(spec_of(c)) {
    DGB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int bs = spec.block_size;
    const int per_seq = (c.context + bs - 1) / bs;
    width = per_seq;
    num_blocks = c.rotations * c.batch * per_seq;
    const std::size_t esize = dg::dtype_size(spec.dtype);
    const std::size_t cache_elems = static_cast<std::size_t>(num_blocks) * spec.block_elems();
    const std::size_t qo_elems = static_cast<std::size_t>(c.batch) * spec.num_q_heads * spec.head_size;
    for (int l = 0; l < c.layers; ++l) {
      k.push_back(dmalloc(cache_elems * spec.kv_elem_size()));
      v.push_back(dmalloc(cache_elems * spec.kv_elem_size()));
      q.push_back(dmalloc(qo_elems * esize));
      out.push_back(dmalloc(qo_elems * esize));
      dgbench::fill_random_kv_device(spec, k.back(), cache_elems, 100 + 4 * l, stream);
      dgbench::fill_random_kv_device(spec, v.back(), cache_elems, 101 + 4 * l, stream);
      dgbench::fill_random_device(spec.dtype, q.back(), qo_elems, 102 + 4 * l, stream);
    }
    if (spec.fp8_kv()) {
      const std::vector<float> h(static_cast<std::size_t>(spec.num_kv_heads), dgbench::kFillKvScale);
      scales = static_cast<float*>(dmalloc(h.size() * sizeof(float)));
      DGB_CUDA_CHECK(cudaMemcpy(scales, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    // Rotation r owns a disjoint, shuffled set of blocks: slice r of one permutation of every block
    // id, made on the device, then copied to the pinned host tables the graph modes stage from.
    const std::size_t tab = static_cast<std::size_t>(c.batch) * width;
    int32_t* d_ids = static_cast<int32_t*>(dmalloc(sizeof(int32_t) * tab * c.rotations));
    dgbench::shuffled_block_ids_device(d_ids, tab * c.rotations, 7, stream);
    DGB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_lens), sizeof(int32_t) * c.batch));
    std::fill(h_lens, h_lens + c.batch, c.context);
    d_lens = static_cast<int32_t*>(dmalloc(sizeof(int32_t) * c.batch));
    DGB_CUDA_CHECK(cudaMemcpyAsync(d_lens, h_lens, sizeof(int32_t) * c.batch, cudaMemcpyHostToDevice, stream));
    for (int r = 0; r < c.rotations; ++r) {
      int32_t* h = nullptr;
      DGB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h), sizeof(int32_t) * tab));
      h_tables.push_back(h);
      d_tables.push_back(d_ids + r * tab);
      DGB_CUDA_CHECK(cudaMemcpyAsync(h, d_tables.back(), sizeof(int32_t) * tab, cudaMemcpyDeviceToHost, stream));
    }
    DGB_CUDA_CHECK(cudaStreamSynchronize(stream));  // fills and tables done before plan() builds an executor
    for (int p : {512, 1024, plan().partition_size})
      if (p > 0) workspace_bytes = std::max(workspace_bytes, dg::v2_workspace_size(spec, c.batch, c.context, p));
    workspace = dmalloc(workspace_bytes);
  }
  ~Workload() {
    graph.reset();
    callback.reset();
    cudaStreamSynchronize(stream);
    for (void* p : device) cudaFree(p);
    for (int32_t* h : h_tables) cudaFreeHost(h);
    if (h_lens) cudaFreeHost(h_lens);
    if (stream) cudaStreamDestroy(stream);
  }

  /// The executor's plan for this bucket (batch, band holding `context`): what the graph modes
  /// replay, and what eager_plan launches: the graph executor's own plan (this device's model).
  const dg::BucketPlan& plan() {
    if (!plan_) {
      for (const dg::BucketPlan& p : executor(false).plans())
        if (p.band_lo < combo.context && combo.context <= p.band_hi) plan_ = p;
      if (!plan_) throw std::runtime_error("bench_attention: no plan holds context " + std::to_string(combo.context));
    }
    return *plan_;
  }

  dg::Executor& executor(bool with_callback) {
    std::unique_ptr<dg::Executor>& slot = with_callback ? callback : graph;
    if (slot) return *slot;
    dg::ExecutorConfig cfg;
    cfg.spec = spec;
    cfg.num_layers = combo.layers;
    for (int l = 0; l < combo.layers; ++l) {
      dg::LayerBuffers lb;
      lb.k_cache = k[l];
      lb.v_cache = v[l];
      lb.q = q[l];
      lb.out = out[l];
      lb.k_scale = lb.v_scale = scales;
      cfg.layers.push_back(lb);
    }
    cfg.max_batch = combo.batch;
    cfg.batch_buckets = {combo.batch};
    cfg.max_seq_len = combo.context;
    cfg.max_blocks_per_seq = width;
    cfg.num_blocks = num_blocks;
    cfg.append_kv = false;  // attention only, as the eager modes
    cfg.backend = dg::BackendKind::kCuda;
    cfg.capture = dg::CapturePolicy::kLazy;
    dg::StepBody body;
    if (with_callback) {
      const int layers = combo.layers;
      body = [layers](dg::StepContext& ctx) {
        for (int l = 0; l < layers; ++l) ctx.attention(l);
      };
    }
    slot = std::make_unique<dg::Executor>(cfg, body);
    return *slot;
  }

  /// One decode step in `mode` using rotation r (eager modes: the legacy pass 1 when `legacy`);
  /// enqueues only (no synchronisation).
  void step(Mode mode, int r, bool legacy) {
    if (mode == Mode::kGraph || mode == Mode::kGraphCallback) {
      dg::StepInputs in;
      in.num_seqs = combo.batch;
      in.seq_lens = h_lens;
      in.block_tables = h_tables[r];
      in.block_table_stride = width;
      in.space = dg::MemorySpace::kHost;
      executor(mode == Mode::kGraphCallback).step(in);
      return;
    }
    for (int l = 0; l < combo.layers; ++l) {
      dg::DecodeArgs a;
      a.spec = spec;
      a.num_seqs = combo.batch;
      a.max_seq_len = combo.context;
      a.block_table_stride = width;
      a.num_blocks = num_blocks;
      a.q = q[l];
      a.out = out[l];
      a.k_cache = k[l];
      a.v_cache = v[l];
      a.block_tables = d_tables[r];
      a.seq_lens = d_lens;
      a.k_scale = a.v_scale = scales;
      const bool plan_v1 = mode == Mode::kEagerPlan && plan_->kernel == dg::KernelKind::kV1;
      const int p = mode == Mode::kEagerV2P512 ? 512 : mode == Mode::kEagerV2P1024 ? 1024 : plan_->partition_size;
      const bool v1 = mode == Mode::kEagerV1 || plan_v1;
      if (v1 && legacy)
        dg::legacy::paged_attention_v1(a, stream);
      else if (v1)
        dg::paged_attention_v1(a, stream);
      else if (legacy)
        dg::legacy::paged_attention_v2(a, p, workspace, workspace_bytes, stream);
      else
        dg::paged_attention_v2(a, p, workspace, workspace_bytes, stream);
    }
  }

  cudaStream_t stream_of(Mode mode) {
    if (mode == Mode::kGraph) return executor(false).stream();
    if (mode == Mode::kGraphCallback) return executor(true).stream();
    return stream;
  }
};

std::string combo_key(const Combo& c) {
  return dgbench::strf("%s/%s/%d/%d/%d", c.model->name, dg::to_string(c.kv), c.layers, c.batch, c.context);
}

/// The workload of combo c (built on first use), or nullptr when its caches do not fit in free memory.
Workload* workload_for(const Combo& c) {
  static std::unique_ptr<Workload> current;
  static std::string key;
  if (!current || key != combo_key(c)) {
    current.reset();  // free the previous combo's memory first
    key.clear();
    std::size_t free_b = 0, total_b = 0;
    DGB_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (c.total_bytes > 0.9 * static_cast<double>(free_b)) return nullptr;
    current = std::make_unique<Workload>(c);
    key = combo_key(c);
  }
  return current.get();
}

void BM_AttentionBody(benchmark::State& state, Combo c, Mode mode, bool legacy) {
  if (!dg::cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Workload* wp = workload_for(c);
  if (!wp) {
    state.SkipWithError(dgbench::strf("KV caches need %.1f GB; not enough free device memory", c.total_bytes / 1e9).c_str());
    return;
  }
  Workload& w = *wp;
  const dg::BucketPlan& plan = w.plan();  // the graph modes replay it; eager_plan launches it
  dg::KernelKind kernel = mode == Mode::kEagerV1 ? dg::KernelKind::kV1 : dg::KernelKind::kV2;
  int plan_p = mode == Mode::kEagerV2P512 ? 512 : mode == Mode::kEagerV2P1024 ? 1024 : 0;
  if (mode == Mode::kEagerPlan || mode == Mode::kGraph || mode == Mode::kGraphCallback) {
    kernel = plan.kernel;
    plan_p = plan.kernel == dg::KernelKind::kV2 ? plan.partition_size : 0;
  }
  const double bytes = c.layers * dgbench::attention_bytes(w.spec, w.h_lens, c.batch, kernel, plan_p);
  const double peak = read_bandwidth_gbs();
  const double copy_peak = copy_bandwidth_gbs();

  cudaStream_t s = w.stream_of(mode);
  struct Events {  // destroyed on every path, including a library Error thrown by step()
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    Events() {
      DGB_CUDA_CHECK(cudaEventCreate(&e0));
      DGB_CUDA_CHECK(cudaEventCreate(&e1));
    }
    ~Events() {
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
  } ev;
  cudaEvent_t e0 = ev.e0, e1 = ev.e1;
  int r = 0;
  // Warm-up: captures the graph, touches every rotation once (up to 8).
  for (int i = 0; i < std::min(c.rotations, 8) + 2; ++i) {
    w.step(mode, r, legacy);
    r = (r + 1) % c.rotations;
  }
  DGB_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> us;
  for (auto _ : state) {
    DGB_CUDA_CHECK(cudaEventRecord(e0, s));
    w.step(mode, r, legacy);
    DGB_CUDA_CHECK(cudaEventRecord(e1, s));
    DGB_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DGB_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    state.SetIterationTime(ms * 1e-3);
    us.push_back(ms * 1e3);
    r = (r + 1) % c.rotations;
  }
  const double med = dgbench::percentile(us, 50);
  state.counters["us_per_step"] = med;
  state.counters["bytes"] = bytes;
  state.counters["GBps"] = med > 0 ? bytes / (med * 1e-6) / 1e9 : 0;
  state.counters["pct_read_bw"] = med > 0 && peak > 0 ? 100.0 * bytes / (med * 1e-6) / 1e9 / peak : 0;
  state.counters["pct_copy_bw"] = med > 0 && copy_peak > 0 ? 100.0 * bytes / (med * 1e-6) / 1e9 / copy_peak : 0;
  state.counters["read_bw_GBps"] = peak;
  state.counters["copy_bw_GBps"] = copy_peak;
  state.counters["us_p99"] = dgbench::percentile(us, 99);
  state.counters["kernel_v2"] = kernel == dg::KernelKind::kV2 ? 1 : 0;
  state.counters["P"] = plan_p;
  state.counters["rotations"] = c.rotations;
  state.SetLabel(std::string(dg::to_string(kernel)) + (legacy ? " legacy" : ""));
}

// A library Error (an unsupported shape, a failed launch) becomes an error row instead of ending the run.
void BM_Attention(benchmark::State& state, Combo c, Mode mode, bool legacy) {
  try {
    BM_AttentionBody(state, c, mode, legacy);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// The streaming-read ceiling itself, as its own row.
void BM_ReadBandwidth(benchmark::State& state) {
  if (!dg::cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  dgbench::ReadBandwidth r{};
  for (auto _ : state) {
    r = dgbench::measure_read_bandwidth(dgbench::default_bandwidth_buffer_bytes(), 10);
    state.SetIterationTime(static_cast<double>(r.buffer_bytes) / (r.median_gbs * 1e9));
  }
  state.counters["GBps"] = r.median_gbs;
  state.counters["best_GBps"] = r.best_gbs;
  state.counters["buffer_bytes"] = static_cast<double>(r.buffer_bytes);
}

/// The device-to-device copy ceiling (read + write), as its own row.
void BM_CopyBandwidth(benchmark::State& state) {
  if (!dg::cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  dgbench::ReadBandwidth r{};
  for (auto _ : state) {
    r = dgbench::measure_copy_bandwidth(dgbench::default_bandwidth_buffer_bytes(), 10);
    state.SetIterationTime(2.0 * static_cast<double>(r.buffer_bytes) / (r.median_gbs * 1e9));
  }
  state.counters["GBps"] = r.median_gbs;
  state.counters["best_GBps"] = r.best_gbs;
  state.counters["buffer_bytes"] = static_cast<double>(r.buffer_bytes);
}

void register_all() {
  benchmark::RegisterBenchmark("BM_ReadBandwidth", BM_ReadBandwidth)->UseManualTime()->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_CopyBandwidth", BM_CopyBandwidth)->UseManualTime()->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  const int batches[] = {1, 8, 32, 64, 128};
  const int contexts[] = {512, 1024, 2048, 4096, 8192, 8193, 16384, 32768, 65536, 131072};
  const Mode modes[] = {Mode::kEagerV1,     Mode::kEagerV2P512, Mode::kEagerV2P1024,
                        Mode::kEagerPlan, Mode::kGraph,       Mode::kGraphCallback};
  int registered = 0, skipped = 0;
  for (const char* model_name : {"llama3-8b", "llama3-70b-tp8", "mha"})
  for (dg::KVCacheDType kv : {dg::KVCacheDType::kAuto, dg::KVCacheDType::kFp8E4M3, dg::KVCacheDType::kFp8E5M2}) {
    const dgbench::ModelPreset* model = dgbench::find_preset(model_name);
    dg::AttentionSpec spec = dgbench::spec_of(*model);
    spec.kv_dtype = kv;
    for (int layers : {1, 32}) {
      for (int batch : batches) {
        for (int context : contexts) {
          Combo c{model, kv, layers, batch, context, rotations_for(spec, layers, batch, context), 0};
          const int per_seq = (context + spec.block_size - 1) / spec.block_size;
          c.total_bytes = static_cast<double>(layers) * c.rotations *
                          dgbench::kv_bytes(spec, static_cast<long long>(batch) * per_seq * spec.block_size);
          if (c.total_bytes > kMaxBytes) {
            skipped += static_cast<int>(std::size(modes));
            continue;
          }
          for (Mode m : modes) {
            const bool eager = m != Mode::kGraph && m != Mode::kGraphCallback;
            for (bool legacy : {false, true}) {
              if (legacy && !(eager && dg::legacy::supports(spec))) continue;
              const std::string name =
                  dgbench::strf("BM_Attention/model:%s/kv:%s/layers:%d/batch:%d/context:%d/mode:%s/kernel:%s",
                                model_name, dg::to_string(kv), layers, batch, context, mode_name(m),
                                legacy ? "legacy" : "new");
              benchmark::RegisterBenchmark(name.c_str(), BM_Attention, c, m, legacy)->UseManualTime()->Unit(
                  benchmark::kMicrosecond);
              ++registered;
            }
          }
        }
      }
    }
  }
  std::fprintf(stderr, "bench_attention: %d benchmarks registered, %d skipped (KV above %.0f GB)\n", registered,
               skipped, kMaxBytes / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
