// libFuzzer target (a): configuration checks, planning and step-input validation.
// The input picks an ExecutorConfig (spec, batch buckets, band edges, threshold, partition size,
// kernel policy, device model, budget, ... valid or not) and up to three steps of random num_seqs,
// lengths, block tables, slots and max_seq_len hints.
// Every input must either succeed or throw decodegraph::Error; a successful construction must yield
// plans that keep their invariants, a successful step a result consistent with its inputs.
// Sizes are capped so each input runs in milliseconds; the step's work is skipped past a small bound.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fuzz_common.hpp"

using namespace dgfuzz;

namespace {

std::vector<int> edge_list(FuzzedDataProvider& fdp, int limit) {
  std::vector<int> v;
  const int n = fdp.ConsumeIntegralInRange(0, 8);
  for (int i = 0; i < n; ++i) v.push_back(fdp.ConsumeIntegralInRange(-2, limit + 2));
  if (fdp.ConsumeBool()) std::sort(v.begin(), v.end());  // mostly increasing lists
  if (fdp.ConsumeBool()) v.push_back(limit);
  return v;
}

void check_plans(const Executor& ex) {
  const ExecutorConfig& c = ex.config();
  const auto& plans = ex.plans();
  check(!plans.empty(), "no plans");
  check(c.band_edges.back() == c.max_seq_len, "last band edge is not max_seq_len", c.band_edges.back());
  check(c.batch_buckets.back() == c.max_batch, "last bucket is not max_batch", c.batch_buckets.back());
  check(c.device_model.num_sms >= 1 && c.device_model.blocks_per_sm >= 1, "device model not resolved",
        c.device_model.num_sms, c.device_model.blocks_per_sm);
  const bool measured = c.policy == KernelPolicy::kMeasured;
  std::size_t largest = 0;
  std::map<int, const BucketPlan*> by_graph;
  for (const BucketPlan& p : plans) {
    check(p.batch >= 1 && p.batch <= c.max_batch, "plan batch out of range", p.batch);
    check(p.band_lo < p.band_hi && p.band_hi <= c.max_seq_len, "plan band", p.band_lo, p.band_hi);
    check(p.band >= 0 && p.band < static_cast<int>(c.band_edges.size()), "plan band index", p.band);
    check(c.band_edges[p.band] == p.band_hi, "band_hi is not its edge", p.band, p.band_hi);
    const bool v2 = p.kernel == KernelKind::kV2;
    check(v2 || p.band_hi <= c.v2_threshold, "V1 above the threshold", p.band_hi, c.v2_threshold);
    if (c.policy == KernelPolicy::kThreshold)
      check(v2 == (p.band_hi > c.v2_threshold), "kThreshold is not the threshold rule", p.band_hi);
    if (c.policy == KernelPolicy::kAuto && p.band_hi <= c.v2_threshold)
      check(v2 == (static_cast<long long>(p.grid_y) * p.grid_z < c.device_model.target_blocks()),
            "kAuto's V1/V2 choice against the target", p.grid_y * p.grid_z, c.device_model.target_blocks());
    check(p.grid_x >= 1 && p.grid_y >= 1 && p.grid_z >= 1, "empty grid", p.grid_x, p.grid_z);
    check(p.blocks == p.grid_x * p.grid_y * p.grid_z, "blocks are not the grid", p.blocks);
    check(p.launch_len >= p.band_hi && p.launch_len <= c.max_seq_len, "launch length", p.launch_len, p.band_hi);
    if (v2) {
      check(p.partition_size > 0 && p.partition_size % c.spec.block_size == 0, "partition size",
            p.partition_size);
      check(p.workspace_bytes ==
                v2_workspace_size(c.spec, p.batch, p.band_hi, p.partition_size),
            "workspace bytes", static_cast<long long>(p.workspace_bytes));
      check(p.max_partitions == num_partitions(p.band_hi, p.partition_size), "max partitions",
            p.max_partitions);
    } else {
      check(p.workspace_bytes == 0, "V1 plan with workspace", static_cast<long long>(p.workspace_bytes));
    }
    check(measured || p.graph_id >= 0, "undecided plan outside kMeasured", p.graph_id);
    if (p.graph_id >= 0) {  // buckets sharing a graph launch identically
      const auto [it, fresh] = by_graph.emplace(p.graph_id, &p);
      const BucketPlan& g = *it->second;
      check(fresh || (g.kernel == p.kernel && g.batch == p.batch && g.partition_size == p.partition_size &&
                      g.grid_x == p.grid_x && g.grid_y == p.grid_y && g.launch_len == p.launch_len &&
                      g.workspace_bytes == p.workspace_bytes),
            "a shared graph with different launches", p.graph_id, g.band);
    }
    largest = std::max(largest, p.workspace_bytes);
  }
  const MemoryReport m = ex.memory();
  // kMeasured also sizes the workspace for its candidates.
  check(measured ? m.workspace >= largest : m.workspace == largest, "workspace not sized for the largest plan",
        static_cast<long long>(m.workspace), static_cast<long long>(largest));
  if (c.memory_budget_bytes != 0)
    check(m.total() <= c.memory_budget_bytes, "memory over budget", static_cast<long long>(m.total()),
          static_cast<long long>(c.memory_budget_bytes));
  check(!ex.plan_table().empty(), "empty plan table");
}

void run(FuzzedDataProvider& fdp) {
  ExecutorConfig c;
  const int head_sizes[] = {64, 128, 80, 100};
  const int block_sizes[] = {8, 16, 32, 12};
  c.spec.head_size = head_sizes[fdp.ConsumeIntegralInRange(0, 3)];
  c.spec.block_size = block_sizes[fdp.ConsumeIntegralInRange(0, 3)];
  c.spec.num_kv_heads = fdp.ConsumeIntegralInRange(0, 2);
  c.spec.num_q_heads = c.spec.num_kv_heads * fdp.ConsumeIntegralInRange(1, 3) + (fdp.ConsumeBool() ? 0 : 1);
  c.spec.dtype = static_cast<DType>(fdp.ConsumeIntegralInRange(0, 3));
  c.spec.layout = static_cast<KVLayout>(fdp.ConsumeIntegralInRange(0, 2));
  c.spec.scale = fdp.ConsumeBool() ? 0.0f : fdp.ConsumeFloatingPoint<float>();
  c.num_layers = fdp.ConsumeIntegralInRange(0, 2);
  c.max_batch = fdp.ConsumeIntegralInRange(-1, 24);
  c.max_seq_len = fdp.ConsumeIntegralInRange(-1, 2048);
  c.num_blocks = fdp.ConsumeIntegralInRange(-1, 48);
  c.max_blocks_per_seq = fdp.ConsumeBool() ? 0 : fdp.ConsumeIntegralInRange(-1, 300);
  c.v2_threshold = fdp.ConsumeBool() ? std::max(1, c.max_seq_len / 2) : fdp.ConsumeIntegralInRange(-1, 2100);
  if (fdp.ConsumeBool()) c.band_edges = edge_list(fdp, c.max_seq_len);
  if (fdp.ConsumeBool()) c.batch_buckets = edge_list(fdp, c.max_batch);
  c.partition_size = fdp.ConsumeBool() ? 0 : fdp.ConsumeIntegralInRange(-16, 4) * 32 + fdp.ConsumeIntegralInRange(0, 1) * 8;
  c.device_model.num_sms = fdp.ConsumeIntegralInRange(-1, 200);
  c.device_model.blocks_per_sm = fdp.ConsumeBool() ? 0 : fdp.ConsumeIntegralInRange(-1, 70);
  c.policy = static_cast<KernelPolicy>(fdp.ConsumeIntegralInRange(0, 3));
  // kMeasured on the host backend times its candidates by running CPU attention, for every band of
  // every bucket when captured up front: a large config then takes tens of seconds per input (past
  // libFuzzer's timeout). Measure small configs only; larger ones plan with kAuto.
  if (c.policy == KernelPolicy::kMeasured &&
      static_cast<long long>(std::max(c.max_batch, 1)) * std::max(c.max_seq_len, 1) * std::max(c.num_layers, 1) > 4096)
    c.policy = KernelPolicy::kAuto;
  c.measure_replays = 1;
  c.capture = static_cast<CapturePolicy>(fdp.ConsumeIntegralInRange(0, 2));
  c.backend = static_cast<BackendKind>(fdp.ConsumeIntegralInRange(0, 1) * 2);  // auto or host; 1..3 below
  if (fdp.ConsumeIntegralInRange(0, 15) == 0) c.backend = static_cast<BackendKind>(fdp.ConsumeIntegralInRange(1, 3));
  c.validation = ValidationLevel::kFull;  // kCheap trusts block ids: random ids would read out of bounds
  if (fdp.ConsumeIntegralInRange(0, 15) == 0) c.validation = static_cast<ValidationLevel>(5);
  c.append_kv = fdp.ConsumeBool();
  c.memory_budget_bytes = fdp.ConsumeBool() ? 0 : fdp.ConsumeIntegralInRange<std::size_t>(0, 1 << 22);
  c.log_level = fdp.ConsumeIntegralInRange(0, 7) == 0 ? fdp.ConsumeRandomLengthString(8) : "off";
  if (fdp.ConsumeBool()) {
    c.alibi_slopes.resize(fdp.ConsumeIntegralInRange(0, 8));
    for (float& s : c.alibi_slopes) s = fdp.ConsumeFloatingPointInRange(-1.0f, 1.0f);
  }

  // KV caches for whatever the config claims (sizes capped above); a layer entry may be missing.
  std::vector<Storage> caches;
  int layer_entries = c.num_layers;
  if (fdp.ConsumeIntegralInRange(0, 7) == 0) layer_entries += fdp.ConsumeIntegralInRange(-1, 1);
  layer_entries = std::max(layer_entries, 0);
  const std::size_t cache_bytes = static_cast<std::size_t>(std::max(c.num_blocks, 0)) *
                                  std::max(c.spec.block_size, 0) * std::max(c.spec.num_kv_heads, 0) *
                                  c.spec.head_size * 4;
  for (int l = 0; l < layer_entries; ++l) {
    caches.emplace_back(cache_bytes);
    caches.emplace_back(cache_bytes);
    LayerBuffers lb;
    lb.k_cache = caches[caches.size() - 2].data();
    lb.v_cache = fdp.ConsumeIntegralInRange(0, 31) == 0 ? nullptr : caches.back().data();
    lb.k_cache_bytes = lb.v_cache_bytes = cache_bytes;  // the host backend cannot ask for them
    c.layers.push_back(lb);
  }

  std::unique_ptr<Executor> ex;
  try {
    ex = std::make_unique<Executor>(c);
  } catch (const Error&) {
    return;  // rejected configuration: fine
  }
  check_plans(*ex);

  const ExecutorConfig& rc = ex->config();
  const int steps = fdp.ConsumeIntegralInRange(1, 3);
  for (int s = 0; s < steps && fdp.remaining_bytes() > 0; ++s) {
    const int n = fdp.ConsumeIntegralInRange(-1, rc.max_batch + 1);
    const int rows = std::max(n, 0);
    const int stride = fdp.ConsumeBool() ? rc.max_blocks_per_seq : fdp.ConsumeIntegralInRange(-1, rc.max_blocks_per_seq + 2);
    std::vector<int32_t> lens(rows), tables(static_cast<std::size_t>(rows) * std::max(stride, 0) + 1);
    std::vector<int64_t> slots(rows);
    const bool sane = fdp.ConsumeBool();  // mostly in-range inputs, so steps also succeed
    for (auto& len : lens)
      len = sane ? fdp.ConsumeIntegralInRange(1, rc.max_seq_len) : fdp.ConsumeIntegralInRange(-2, rc.max_seq_len + 2);
    for (auto& id : tables)
      id = sane ? fdp.ConsumeIntegralInRange(0, rc.num_blocks - 1) : fdp.ConsumeIntegralInRange(-2, rc.num_blocks + 1);
    for (auto& slot : slots)
      slot = fdp.ConsumeIntegralInRange<int64_t>(-2, static_cast<int64_t>(rc.num_blocks) * rc.spec.block_size + (sane ? -1 : 2));
    // Bound the host work of one input; planning and validation above are what this target is for.
    long long work = 0;
    for (int len : lens) work += std::max(len, 0);
    work *= static_cast<long long>(rc.spec.num_q_heads) * rc.spec.head_size * rc.num_layers;
    if (work > (1 << 22)) continue;

    StepInputs in;
    in.num_seqs = n;
    in.seq_lens = fdp.ConsumeIntegralInRange(0, 31) == 0 ? nullptr : lens.data();
    in.block_tables = tables.data();
    in.block_table_stride = stride;
    in.slot_mapping = fdp.ConsumeIntegralInRange(0, 15) == 0 ? nullptr : slots.data();
    if (fdp.ConsumeIntegralInRange(0, 3) == 0) in.max_seq_len = fdp.ConsumeIntegralInRange(-2, rc.max_seq_len + 2);
    const ExecutorStats before = ex->stats();
    try {
      const StepResult r = ex->step(in);
      const int longest = *std::max_element(lens.begin(), lens.end());
      check(n >= 1 && n <= rc.max_batch, "accepted num_seqs", n);
      check(r.bucket_batch_size >= n, "bucket smaller than the batch", r.bucket_batch_size, n);
      check(r.band_hi >= longest, "band shorter than the longest sequence", r.band_hi, longest);
      // kHost picks the band from the hint; kDevice's graph picks it from the staged lengths.
      check(ex->band_select() == BandSelect::kDevice || r.band_hi >= in.max_seq_len,
            "band shorter than the max_seq_len hint", r.band_hi, in.max_seq_len);
      check(in.max_seq_len == 0 || longest <= in.max_seq_len, "a hint below a host length was accepted",
            in.max_seq_len, longest);
      check(r.kernel == KernelKind::kV2 || r.band_hi <= rc.v2_threshold, "V1 step above the threshold", r.band_hi);
      const BucketPlan& p = ex->plan_for(r);
      // kDevice replays the batch bucket's graph (numbered by bucket); the plan's graph_id names its branch.
      const int graph = ex->band_select() == BandSelect::kDevice ? r.bucket.value : p.graph_id;
      check(p.batch == r.bucket_batch_size && p.kernel == r.kernel && graph == r.graph_id && p.graph_id >= 0,
            "step result and its plan disagree", graph, r.graph_id);
      check(ex->stats().steps == before.steps + 1, "steps not counted");
    } catch (const Error&) {
      const ExecutorStats after = ex->stats();
      check(after.steps == before.steps, "a rejected step was counted");
      check(after.rejected_steps == before.rejected_steps + 1, "rejection not counted");
    }
  }
  check_plans(*ex);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  try {
    run(fdp);
  } catch (const Error&) {
    // Errors from accessors are fine too; anything else escapes and is a finding.
  }
  return 0;
}
