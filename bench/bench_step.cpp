// Host cost of Executor::step() alone: validation, bucket choice, staging and launch submission, at
// batch 1, 64 and 256 (target: <= 3 us at batch 64 on the CUDA backend).
//
// What is timed: the wall time of one step() call, from entry to return, per iteration (manual
// timing; the counter us_per_step is the median); with inputs:host_staging also the host_staging()
// call before it, which an engine makes every step. On CUDA the stream is drained before every
// step, outside the timed region: before it rewrites a pinned staging slot step() waits for the
// copies that last read it (two steps back: the slots are used in turn), and back to back, once the
// device falls behind, that wait would time the device, not the host.
//
// Modes (the name's body: axis):
//   body:empty      a step body that enqueues nothing. The graph is empty, so what remains is exactly
//                   the host side: validation, bucket choice, staging copies and the graph launch (or,
//                   on the host backend, the replay of an empty recording). This is the number to
//                   compare with the 3 us target, on either backend.
//   body:attention  the default attention-only step (KV append + attention, 1 layer, 16-token
//                   context). On CUDA step() only submits the work, so this adds the cost of
//                   launching a non-empty graph. On the host backend the replay runs the host kernels
//                   inside step(), so this number is dominated by CPU attention, not by step().
// Axes: backend (host; cuda, which reports "no CUDA device" without one), context (body:empty
// only: 16 tokens, or 32768, where the block table is 2 MiB at batch 256 and its copies dominate;
// every sequence shares one row of blocks there, as nothing reads the cache), validation
// (cheap/full), inputs, batch. inputs:
//   host          the caller's arrays: step() copies them into the pinned staging buffers, then DMAs
//   host_staging  written into host_staging() (once; the contents do not change): only the DMA
//   device        device memory (CUDA): step() copies seq_lens back synchronously to find the band
//   device_hint   device memory with StepInputs::max_seq_len: nothing is read back (kCheap)
// band: host (BandSelect::kHost: one graph per plan, the band found on the host) or device
// (kDevice: one graph per batch bucket, a SWITCH node per layer; device inputs are never read back).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace dg = decodegraph;

namespace {

constexpr int kShortContext = 16;  // one block: keeps the attention body's device/CPU work minimal
constexpr int kLongContext = 32768;

enum class Inputs { kHost, kHostStaging, kDevice, kDeviceHint };
const char* name_of(Inputs i) {
  switch (i) {
    case Inputs::kHost: return "host";
    case Inputs::kHostStaging: return "host_staging";
    case Inputs::kDevice: return "device";
    case Inputs::kDeviceHint: return "device_hint";
  }
  return "?";
}

struct StepRig {
  bool device = false;
  dg::AttentionSpec spec;
  int batch = 0;
  int context = 0;
  int num_blocks = 0;
  int width = 0;
  std::vector<void*> owned;  // device allocations (CUDA)
  std::vector<std::vector<unsigned char>> host_owned;
  std::vector<int32_t> lens, tables;
  std::vector<int64_t> slots;
  int32_t* d_lens = nullptr;
  int32_t* d_tables = nullptr;
  int64_t* d_slots = nullptr;
  std::unique_ptr<dg::Executor> ex;

  void* alloc(std::size_t bytes, std::uint64_t seed) {
#if DECODEGRAPH_HAS_CUDA
    if (device) {
      void* p = nullptr;
      DGB_CUDA_CHECK(cudaMalloc(&p, bytes));
      owned.push_back(p);
      if (seed) dgbench::fill_random_device(spec.dtype, p, bytes / dg::dtype_size(spec.dtype), seed, nullptr);
      return p;
    }
#endif
    host_owned.emplace_back(bytes + 16);
    void* p = host_owned.back().data();
    if (seed) dgbench::fill_random_host(spec.dtype, p, bytes / dg::dtype_size(spec.dtype), seed);
    return p;
  }
  ~StepRig() {
    ex.reset();
#if DECODEGRAPH_HAS_CUDA
    for (void* p : owned) cudaFree(p);
#endif
  }
};

std::unique_ptr<StepRig> make_rig(dg::BackendKind backend, bool empty_body, dg::ValidationLevel level,
                                  int batch, int context, dg::BandSelect band) {
  auto rig = std::make_unique<StepRig>();
  rig->device = backend == dg::BackendKind::kCuda;
  rig->spec = dgbench::spec_of(*dgbench::find_preset("llama3-8b"));
  rig->batch = batch;
  rig->context = context;
  const int bs = rig->spec.block_size;
  const int per_seq = (context + bs - 1) / bs;
  // Short: distinct blocks per sequence (the attention body appends). Long (empty body only): one
  // shared row of blocks, so the cache stays 2 x 64 MiB; it is never read, so it is not filled.
  const bool shared = context > kShortContext;
  rig->num_blocks = shared ? per_seq : batch * per_seq;
  const std::size_t cache_bytes =
      static_cast<std::size_t>(rig->num_blocks) * rig->spec.block_elems() * dg::dtype_size(rig->spec.dtype);
  dg::ExecutorConfig cfg;
  cfg.spec = rig->spec;
  cfg.num_layers = 1;
  cfg.layers.push_back({rig->alloc(cache_bytes, shared ? 0 : 11), rig->alloc(cache_bytes, shared ? 0 : 12)});
  cfg.layers.back().k_cache_bytes = cfg.layers.back().v_cache_bytes = cache_bytes;  // the host backend cannot ask
  cfg.max_batch = 256;
  cfg.max_seq_len = kLongContext;
  cfg.num_blocks = rig->num_blocks;
  cfg.backend = backend;
  cfg.validation = level;
  cfg.capture = dg::CapturePolicy::kLazy;
  cfg.band_select = band;
  dg::StepBody body;
  if (empty_body) body = [](dg::StepContext&) {};
  rig->ex = std::make_unique<dg::Executor>(cfg, body);
  rig->width = rig->ex->config().max_blocks_per_seq > 0 ? rig->ex->config().max_blocks_per_seq
                                                        : (cfg.max_seq_len + bs - 1) / bs;
  rig->lens.assign(batch, context);
  rig->tables.assign(static_cast<std::size_t>(batch) * rig->width, 0);
  rig->slots.resize(batch);
  for (int i = 0; i < batch; ++i) {
    const int first = shared ? 0 : i * per_seq;
    for (int b = 0; b < per_seq; ++b) rig->tables[static_cast<std::size_t>(i) * rig->width + b] = first + b;
    // The slot of position context - 1 (kFull checks it): the last block of the row.
    rig->slots[i] = static_cast<int64_t>(first + per_seq - 1) * bs + (context - 1) % bs;
  }
  for (int l = 0; l < 1; ++l) {
    const std::size_t qn = static_cast<std::size_t>(256) * rig->spec.num_q_heads * rig->spec.head_size;
    const std::size_t kn = static_cast<std::size_t>(256) * rig->spec.num_kv_heads * rig->spec.head_size;
#if DECODEGRAPH_HAS_CUDA
    if (rig->device) {
      dgbench::fill_random_device(rig->spec.dtype, rig->ex->query(l), qn, 21, nullptr);
      dgbench::fill_random_device(rig->spec.dtype, rig->ex->new_key(l), kn, 22, nullptr);
      dgbench::fill_random_device(rig->spec.dtype, rig->ex->new_value(l), kn, 23, nullptr);
      continue;
    }
#endif
    dgbench::fill_random_host(rig->spec.dtype, rig->ex->query(l), qn, 21);
    dgbench::fill_random_host(rig->spec.dtype, rig->ex->new_key(l), kn, 22);
    dgbench::fill_random_host(rig->spec.dtype, rig->ex->new_value(l), kn, 23);
  }
#if DECODEGRAPH_HAS_CUDA
  if (rig->device) {
    DGB_CUDA_CHECK(cudaMalloc(&rig->d_lens, sizeof(int32_t) * batch));
    DGB_CUDA_CHECK(cudaMalloc(&rig->d_tables, sizeof(int32_t) * rig->tables.size()));
    DGB_CUDA_CHECK(cudaMalloc(&rig->d_slots, sizeof(int64_t) * batch));
    rig->owned.push_back(rig->d_lens);
    rig->owned.push_back(rig->d_tables);
    rig->owned.push_back(rig->d_slots);
    DGB_CUDA_CHECK(cudaMemcpy(rig->d_lens, rig->lens.data(), sizeof(int32_t) * batch, cudaMemcpyHostToDevice));
    DGB_CUDA_CHECK(cudaMemcpy(rig->d_tables, rig->tables.data(), sizeof(int32_t) * rig->tables.size(),
                              cudaMemcpyHostToDevice));
    DGB_CUDA_CHECK(cudaMemcpy(rig->d_slots, rig->slots.data(), sizeof(int64_t) * batch, cudaMemcpyHostToDevice));
    DGB_CUDA_CHECK(cudaDeviceSynchronize());
  }
#endif
  return rig;
}

void drain(const StepRig& rig) {
#if DECODEGRAPH_HAS_CUDA
  if (rig.device) DGB_CUDA_CHECK(cudaStreamSynchronize(rig.ex->stream()));
#else
  (void)rig;
#endif
}

void BM_StepBody(benchmark::State& state, dg::BackendKind backend, bool empty_body, int context,
                 dg::ValidationLevel level, Inputs inputs, dg::BandSelect band) {
  if (backend == dg::BackendKind::kCuda && !dg::cuda_device_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int batch = static_cast<int>(state.range(0));
  std::unique_ptr<StepRig> rig = make_rig(backend, empty_body, level, batch, context, band);
  if (rig->ex->band_select() != band) {
    state.SkipWithError(("band:device fell back to kHost: " + rig->ex->stats().band_select_note).c_str());
    return;
  }
  dg::StepInputs in;
  in.num_seqs = batch;
  in.block_table_stride = rig->width;
  const bool dev_inputs = inputs == Inputs::kDevice || inputs == Inputs::kDeviceHint;
  in.space = dev_inputs ? dg::MemorySpace::kDevice : dg::MemorySpace::kHost;
  in.seq_lens = dev_inputs ? rig->d_lens : rig->lens.data();
  in.block_tables = dev_inputs ? rig->d_tables : rig->tables.data();
  in.slot_mapping = dev_inputs ? rig->d_slots : rig->slots.data();
  if (inputs == Inputs::kDeviceHint) in.max_seq_len = context;
  const bool staged = inputs == Inputs::kHostStaging;
  if (staged) {  // written once: the contents stay valid across steps that point at them
    const dg::HostStaging h = rig->ex->host_staging();
    std::copy(rig->lens.begin(), rig->lens.end(), h.seq_lens.begin());
    std::copy(rig->slots.begin(), rig->slots.end(), h.slot_mapping.begin());
    std::copy(rig->tables.begin(), rig->tables.end(), h.block_tables.begin());  // width = the staging stride
    in.seq_lens = h.seq_lens.data();
    in.block_tables = h.block_tables.data();
    in.block_table_stride = h.block_table_stride;
    in.slot_mapping = h.slot_mapping.data();
  }

  // Warm-up: the first step captures the bucket's graph; a few more settle caches and allocators.
  for (int i = 0; i < 16; ++i) rig->ex->step(in);
  drain(*rig);

  using Clock = std::chrono::steady_clock;
  std::vector<double> us;  // every sample: the median must not depend on when a run was cut off
  long n = 0;
  for (auto _ : state) {
    // CUDA: step() first waits (event) until the copies that last read its pinned staging slot are
    // done. Back to back, that wait would time the device's copy latency, not the host cost, so the
    // stream is drained before every step, outside the timed region.
    if (rig->device) drain(*rig);
    const auto t0 = Clock::now();
    if (staged) benchmark::DoNotOptimize(rig->ex->host_staging());
    dg::StepResult r = rig->ex->step(in);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(r);
    state.SetIterationTime(dt);
    us.push_back(dt * 1e6);
    if (++n % 256 == 0) drain(*rig);  // outside the timed region
  }
  drain(*rig);
  state.counters["us_per_step"] = dgbench::percentile(us, 50);
  state.counters["us_p99"] = dgbench::percentile(us, 99);
  state.counters["batch"] = batch;
  const dg::ExecutorStats st = rig->ex->stats();
  state.counters["copy_bytes_per_step"] = static_cast<double>(st.staging_copy_bytes) / std::max<long long>(st.steps, 1);
  state.counters["downloads_per_step"] = static_cast<double>(st.input_downloads) / std::max<long long>(st.steps, 1);
}

// A library Error (an unsupported shape, a failed launch) becomes an error row instead of ending the run.
void BM_Step(benchmark::State& state, dg::BackendKind backend, bool empty_body, int context,
             dg::ValidationLevel level, Inputs inputs, dg::BandSelect band) {
  try {
    BM_StepBody(state, backend, empty_body, context, level, inputs, band);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_all() {
  struct B {
    dg::BackendKind kind;
    const char* name;
  };
  for (B b : {B{dg::BackendKind::kHost, "host"}, B{dg::BackendKind::kCuda, "cuda"}}) {
    for (bool empty : {true, false}) {
      for (int context : {kShortContext, kLongContext}) {
        if (!empty && context != kShortContext) continue;  // CPU attention over 32K tokens is not step()
        for (dg::ValidationLevel v : {dg::ValidationLevel::kCheap, dg::ValidationLevel::kFull}) {
          for (Inputs in : {Inputs::kHost, Inputs::kHostStaging, Inputs::kDevice, Inputs::kDeviceHint}) {
            const bool dev = in == Inputs::kDevice || in == Inputs::kDeviceHint;
            if (dev && b.kind != dg::BackendKind::kCuda) continue;
            for (dg::BandSelect band : {dg::BandSelect::kHost, dg::BandSelect::kDevice}) {
              const std::string name =
                  fmt::format("BM_Step/backend:{}/body:{}/context:{}/validation:{}/inputs:{}/band:{}", b.name,
                              empty ? "empty" : "attention", context,
                              v == dg::ValidationLevel::kCheap ? "cheap" : "full", name_of(in), dg::to_string(band));
              benchmark::RegisterBenchmark(name.c_str(), BM_Step, b.kind, empty, context, v, in, band)
                  ->ArgName("batch")
                  ->Arg(1)
                  ->Arg(64)
                  ->Arg(256)
                  ->UseManualTime()
                  ->Unit(benchmark::kMicrosecond);
            }
          }
        }
      }
    }
  }
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
