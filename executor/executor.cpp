// The decode-step executor's public face: construction wires the parts (executor_impl.hpp), step()
// runs one token step through them, rebind_layers() points every graph at new buffers.
//
// One step: report an earlier bad block id -> validate the inputs -> pick the batch bucket -> stage
// the inputs into the static buffers -> the bucket's graph for these inputs (measured and captured
// first when needed; the graph cache's strategy decides which graph) -> launch -> the result.
//
// NOTE(graph): every pointer a captured op reads (staged inputs, q/out/new K/V, workspace, ALiBi,
// the bad-block flag) is allocated once here and never moves; what changes between steps is written
// into those buffers by staging, never baked into a launch. Caller buffers move only through
// rebind_layers, which re-captures and updates every graph.
#include "decodegraph/executor.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "decodegraph/error.hpp"
#include "executor/config_checks.hpp"
#include "executor/device_guard.hpp"
#include "executor/executor_impl.hpp"
#include "executor/log.hpp"
#include "executor/nvtx.hpp"
#include "executor/scoped.hpp"

namespace decodegraph {

using detail::GraphCache;

// ---------------------------------------------------------------- construction

Executor::Executor(ExecutorConfig config, StepBody body) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.log = detail::executor_logger(config.log_level);
  m.make_backend(config.backend);
  detail::DeviceScope device{*m.backend};  // device_guard.hpp: every entry point below binds it too
  const BackendKind kind = m.backend->kind();
  // The device model is queried here, once per layer group, outside any capture.
  const DeviceModel given_model = config.device_model;
  const auto device_model = [&](const AttentionSpec& spec) { return m.backend->device_model(spec); };
  m.cfg = detail::resolve_config(std::move(config), device_model);
  detail::LayerGroups groups(m.cfg, given_model, device_model);
  m.cfg.backend = kind;
  m.memory = std::make_unique<detail::Allocations>(*m.backend);
  m.ledger.budget = m.cfg.memory_budget_bytes;
  m.layers = std::make_unique<detail::LayerSet>(m.cfg, *m.backend, *m.memory, m.ledger);
  m.layers->check_device_ranges(m.cfg.layers);
  m.layers->check_host_values(m.cfg.layers);
  m.layers->warn_missing_cache_sizes(m.cfg.layers, *m.log);
  // Band choice: the probe runs once here, outside any capture; a missing feature is a fallback.
  m.band_mode = detail::choose_band_select(m.cfg, *m.backend, *m.log, m.band_note);
  // PDL: once, from the device's compute capability; off on request or where it cannot overlap.
  if (!m.cfg.programmatic_launch)
    m.programmatic_note = "off (ExecutorConfig::programmatic_launch = false)";
  else
    m.programmatic = m.backend->programmatic_launch_supported(m.programmatic_note);
  m.plans = std::make_unique<detail::PlanBook>(m.cfg, std::move(groups));
  m.build(std::move(body));
  if (m.cfg.capture == CapturePolicy::kUpFront) capture_all();
}

void Executor::Impl::make_backend(BackendKind requested) {
  BackendKind kind = requested;
  if (kind == BackendKind::kAuto) kind = cuda_device_available() ? BackendKind::kCuda : BackendKind::kHost;
  if (kind == BackendKind::kCuda) {
#if DECODEGRAPH_HAS_CUDA
    require(cuda_device_available(), "backend", "cuda", "host or auto (no usable CUDA device is present)");
    backend = detail::make_cuda_backend();
#else
    throw_invalid("backend", "cuda", "host or auto (this build has no CUDA)");
#endif
  } else if (kind == BackendKind::kHost) {
    backend = detail::make_host_backend();
  } else {
    throw_invalid("backend", static_cast<int>(requested), "auto, cuda or host");
  }
}

// Sizes first, so the budget is checked before anything is allocated; any failure after that
// unwinds through Allocations, so nothing leaks.
void Executor::Impl::build(StepBody body) {
  const ExecutorConfig& c = cfg;
  const bool on_device = band_mode == BandSelect::kDevice;
  const std::size_t alibi_bytes = c.alibi_slopes.size() * sizeof(float);
  ledger.workspace_bytes = plans->workspace_bytes();  // every group's plans, and every kMeasured candidate
  ledger.static_bytes = detail::StepStaging::device_bytes(c) + alibi_bytes + detail::BadBlockReport::kDeviceBytes +
                        detail::Measurer::device_bytes(c) + (on_device ? detail::switch_graphs_device_bytes(c) : 0);
  const std::size_t layer_bytes = layers->owned_bytes_missing(c.layers);
  const std::size_t needed = ledger.static_bytes + layer_bytes + ledger.workspace_bytes;
  if (ledger.budget != 0 && needed > ledger.budget)
    throw_invalid("memory_budget_bytes", ledger.budget,
                  ">= " + std::to_string(needed) + " bytes needed (static buffers " +
                      std::to_string(ledger.static_bytes + layer_bytes) + " + V2 workspace " +
                      std::to_string(ledger.workspace_bytes) + "), or 0 for unlimited");

  staging = std::make_unique<detail::StepStaging>(c, band_mode, *backend, *memory);
  bad_blocks = std::make_unique<detail::BadBlockReport>(c, *backend, *memory);
  targets.inputs = staging->device();
  targets.bad_block = bad_blocks->device_flag();
  targets.bad_block_h = bad_blocks->host_copy();
  targets.programmatic = programmatic;
  targets.workspace_bytes = ledger.workspace_bytes;
  if (ledger.workspace_bytes) targets.workspace = memory->device(ledger.workspace_bytes);
  if (alibi_bytes) {
    auto* alibi = static_cast<float*>(memory->device(alibi_bytes));
    backend->upload(alibi, c.alibi_slopes.data(), alibi_bytes);
    targets.alibi = alibi;
  }
  layers->swap(layers->resolve(c.layers));  // adds the owned layer buffers to the static bytes
  recorder = std::make_unique<detail::Recorder>(c, *backend, *layers, *plans, targets, std::move(body));
  measurer = std::make_unique<detail::Measurer>(c, *backend, *memory, *recorder, *staging, *plans, *layers, log);
  const detail::CacheParts parts{c, *backend, *memory, *plans, *recorder, *measurer, targets, ledger, log};
  graphs = on_device ? detail::make_switch_graphs(parts) : detail::make_plan_graphs(parts);

  log->info("executor: backend {}, {} layers, max_batch {}, max_seq_len {}, {} buckets x {} bands, "
            "{} layer groups, policy {}, band select {}, programmatic launch {}, device model {} SMs x {} blocks, {} graphs "
            "({} distinct plans), capture {}, memory {} (static {}, workspace {})",
            to_string(c.backend), c.num_layers, c.max_batch, c.max_seq_len, c.batch_buckets.size(),
            plans->num_bands(), plans->num_groups(), to_string(c.policy), to_string(band_mode),
            programmatic ? std::string("on") : "off: " + programmatic_note, c.device_model.num_sms,
            c.device_model.blocks_per_sm, graphs->distinct_graphs(), plans->launches().size(), to_string(c.capture),
            detail::mib(needed), detail::mib(ledger.static_bytes), detail::mib(ledger.workspace_bytes));
  if (log->should_log(spdlog::level::debug)) log->debug("plans:\n{}", detail::plan_table_text(*plans));
}

Executor::~Executor() = default;
Executor::Executor(Executor&&) noexcept = default;
Executor& Executor::operator=(Executor&&) noexcept = default;

// ---------------------------------------------------------------- step

StepResult Executor::step(const StepInputs& inputs) { return impl_->step(inputs, std::nullopt); }

StepResult Executor::step(const StepInputs& inputs, Stream stream) { return impl_->step(inputs, stream); }

StepResult Executor::Impl::step(const StepInputs& inputs, std::optional<Stream> stream) {
  detail::NvtxRange range("decodegraph::step");
  detail::DeviceScope device{*backend};
  StepResult r;
  try {
    detail::EndStep end{backend.get()};
    backend->begin_step(stream);
    // On a stream the caller is capturing (caller_capture.cpp) nothing may read the inputs back or
    // wait: what cannot be recorded is refused first, and the bad-block report (which may wait)
    // is left to the next step outside the capture or to check_errors().
    const bool caller = backend->in_caller_capture();
    if (caller)
      graphs->check_caller_capture(inputs);
    else
      bad_blocks->report(/*wait=*/false, steps, /*from_step=*/true);
    const detail::Lengths lens = staging->validate(inputs);
    layers->check_host_values(cfg.layers);  // scales and sinks written since the last step
    const int bucket = plans->bucket_of_step(inputs.num_seqs, inputs.q_len);  // (q_len, batch bucket)
    const int batch = plans->plan(bucket, 0).batch;
    auto stage = [&] { staging->stage(inputs, batch, lens.band_len); };
    stage();
    if (caller) {
      r = graphs->record_into_caller(bucket, lens);
    } else {
      const detail::StepGraph g = graphs->graph_for(bucket, lens, stage);
      backend->launch(*g.slot->graph);
      ++g.slot->stats.replays;
      r = g.result;
    }
    if (r.band >= 0) r.launch_id = plans->plan(bucket, r.band).graph_id;
    r.q_len = inputs.q_len;
  } catch (...) {
    ++rejected;
    throw;
  }
  ++steps;
  bad_blocks->note_step(inputs.q_len);
  if (log->should_log(spdlog::level::trace))
    log->trace("step {}: num_seqs {} q_len {} -> batch {} band {} ({}, graph {}){}{}", steps, inputs.num_seqs,
               inputs.q_len, r.bucket_batch_size, r.band, to_string(r.kernel), r.graph_id, r.measured ? ", measured" : "",
               r.captured ? ", captured" : "");
  return r;
}

void Executor::check_errors() {
  detail::DeviceScope device{*impl_->backend};
  impl_->bad_blocks->report(/*wait=*/true, impl_->steps, /*from_step=*/false);
}

HostStaging Executor::host_staging() {
  detail::DeviceScope device{*impl_->backend};
  return impl_->staging->host_staging();
}

void Executor::capture_all() {
  Impl& m = *impl_;
  detail::DeviceScope device{*m.backend};
  // kMeasured stages synthetic inputs and replays: ordered like a step on the executor's stream.
  detail::EndStep end{m.backend.get()};
  m.backend->begin_step(std::nullopt);
  m.graphs->capture_all();
}

// ---------------------------------------------------------------- rebinding

void Executor::rebind_layers(std::vector<LayerBuffers> layers) {
  detail::NvtxRange range("decodegraph::rebind_layers");
  Impl& m = *impl_;
  detail::DeviceScope device{*m.backend};
  // 1. Validation: nothing has changed when this throws.
  m.layers->check_rebind(layers, m.graphs->bytes());
  m.layers->check_host_values(layers);
  m.layers->warn_missing_cache_sizes(layers, *m.log);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<LayerBuffers> resolved = m.layers->resolve(layers);  // owned buffers are kept either way
  // NOTE(graph): a graph still running reads the old buffers; after this, none does.
  m.backend->wait_last_step();

  // 2. Re-capture every captured graph with the new buffers. A failure here restores the old
  //    buffers and leaves every graph as it was.
  std::vector<LayerBuffers> old = m.layers->swap(std::move(resolved));
  std::vector<GraphCache::Rebound> pending;
  try {
    pending = m.graphs->recapture();
  } catch (...) {
    m.layers->swap(std::move(old));
    throw;
  }

  // 3. Apply them. From here on the new buffers are in effect: a graph whose update and
  //    re-instantiation both fail is dropped (captured again when a step needs it), never kept
  //    pointing at the old buffers.
  m.cfg.layers = std::move(layers);
  const GraphCache::RebindResult r = m.graphs->apply(pending);
  m.graph_updates += r.updated;
  m.graph_reinstantiations += r.reinstantiated;
  m.log->info("rebind_layers: {} graphs updated in place, {} re-instantiated, {} dropped, in {:.3f} ms", r.updated,
              r.reinstantiated, r.dropped, detail::ms_since(t0));
  if (r.first_error) std::rethrow_exception(r.first_error);
  ++m.rebinds;
}

// ---------------------------------------------------------------- accessors

BackendKind Executor::backend() const { return impl_->backend->kind(); }
BandSelect Executor::band_select() const { return impl_->band_mode; }
const ExecutorConfig& Executor::config() const { return impl_->cfg; }
const std::vector<BucketPlan>& Executor::plans() const { return impl_->plans->plans(); }

const BucketPlan& Executor::plan_for(BucketIndex bucket, int band) const { return plan_for(0, bucket, band); }

const BucketPlan& Executor::plan_for(int group, BucketIndex bucket, int band) const {
  return plan_for(group, bucket, band, impl_->cfg.q_lens.front());
}

const BucketPlan& Executor::plan_for(int group, BucketIndex bucket, int band, int q_len) const {
  const detail::PlanBook& pb = *impl_->plans;
  detail::check_group(pb, group);
  if (bucket.value < 0 || bucket.value >= pb.num_batch_buckets())
    throw_invalid("bucket", bucket.value,
                  "a batch bucket index 0.." + std::to_string(pb.num_batch_buckets() - 1) +
                      " (not a batch size: see plan_for_batch)");
  if (band < 0 || band >= pb.num_bands())
    throw_invalid("band", band, "a band index 0.." + std::to_string(pb.num_bands() - 1));
  const int q = pb.q_index(q_len);
  if (q < 0) throw_invalid("q_len", q_len, "one of config().q_lens = " + detail::list_text(impl_->cfg.q_lens));
  return pb.group_plan(group, pb.index(pb.bucket(q, bucket.value), band));
}

const BucketPlan& Executor::plan_for(const StepResult& step) const {
  if (step.band < 0 && step.band_on_device)
    throw_invalid("step.band", step.band,
                  "a band known on the host. This step's graph chose its band on the device (BandSelect::kDevice, "
                  "device-resident inputs, kCheap), so no single plan is known: plans_for(step.bucket) has every "
                  "band's plan, and stats().graphs[] (graph_id " + std::to_string(step.graph_id) +
                      ").band_replays counts the bands it ran. Give a max_seq_len hint, host inputs or kFull to "
                      "know the band per step");
  return plan_for(0, step.bucket, step.band, step.q_len);
}

std::span<const BucketPlan> Executor::plans_for(BucketIndex bucket) const { return plans_for(0, bucket); }

std::span<const BucketPlan> Executor::plans_for(int group, BucketIndex bucket) const {
  return plans_for(group, bucket, impl_->cfg.q_lens.front());
}

std::span<const BucketPlan> Executor::plans_for(int group, BucketIndex bucket, int q_len) const {
  const detail::PlanBook& pb = *impl_->plans;
  const BucketPlan& first = plan_for(group, bucket, 0, q_len);  // checks the indices; a bucket's bands are contiguous
  return {&first, static_cast<std::size_t>(pb.num_bands())};
}

const BucketPlan& Executor::plan_for_batch(int batch_size, int band) const {
  return plan_for_batch(batch_size, band, impl_->cfg.q_lens.front());
}

const BucketPlan& Executor::plan_for_batch(int batch_size, int band, int q_len) const {
  const Impl& m = *impl_;
  if (batch_size < 1 || batch_size > m.cfg.max_batch)
    throw_invalid("batch_size", batch_size, "1..max_batch = 1.." + std::to_string(m.cfg.max_batch));
  return plan_for(0, BucketIndex(m.plans->bucket_of_batch(batch_size)), band, q_len);
}

std::string Executor::plan_table() const { return detail::plan_table_text(*impl_->plans); }

std::span<const BucketPlan> Executor::plans(int group) const {
  detail::check_group(*impl_->plans, group);
  return impl_->plans->group_plans(group);
}

int Executor::num_layer_groups() const { return impl_->plans->num_groups(); }

int Executor::layer_group(int layer) const {
  impl_->layers->check_layer(layer);
  return impl_->plans->groups().group_of(layer);
}

const std::vector<int>& Executor::group_layers(int group) const {
  detail::check_group(*impl_->plans, group);
  return impl_->plans->groups()[group].layers;
}

const AttentionSpec& Executor::layer_spec(int layer) const {
  impl_->layers->check_layer(layer);
  return impl_->plans->groups().spec_of(layer);
}

Stream Executor::stream() const { return impl_->backend->stream(); }

void* Executor::query(int layer) {
  impl_->layers->check_layer(layer);
  return (*impl_->layers)[layer].q;
}
void* Executor::output(int layer) {
  impl_->layers->check_layer(layer);
  return (*impl_->layers)[layer].out;
}
void* Executor::new_key(int layer) {
  impl_->layers->check_layer(layer);
  return (*impl_->layers)[layer].new_key;
}
void* Executor::new_value(int layer) {
  impl_->layers->check_layer(layer);
  return (*impl_->layers)[layer].new_value;
}

}  // namespace decodegraph
