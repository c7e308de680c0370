// BandSelect::kDevice's graph cache (graph_cache.hpp): one graph per batch bucket. The graph starts
// with the band-select node, which reduces the staged lengths to their band when the graph runs and
// sets one SWITCH node per attention call; branch i of each holds band i's launches, and bands with
// the same launch share one recording. step() only stages and replays: device-resident inputs need
// neither a host copy nor a hint.
#include <spdlog/spdlog.h>

#include <set>
#include <string>

#include "executor/graph_cache.hpp"
#include "kernels/band_select.cuh"

namespace decodegraph::detail {

BandSelect choose_band_select(const ExecutorConfig& c, Backend& backend, spdlog::logger& log, std::string& note) {
  if (c.band_select != BandSelect::kDevice) return c.band_select;
  std::string why;
  bool ok = false;
  if (c.switch_probe) {
    ok = c.switch_probe();
    if (!ok) why = "the switch_probe hook reported no conditional SWITCH nodes";
  } else {
    ok = backend.switch_supported(why);
  }
  if (ok) return BandSelect::kDevice;
  note = "kDevice unsupported (" + why + "); using kHost";
  log.warn("band_select: conditional SWITCH nodes are not available ({}); falling back to kHost: the band is "
           "chosen on the host each step, one graph per distinct plan",
           why);
  return BandSelect::kHost;
}

std::size_t switch_graphs_device_bytes(const ExecutorConfig& c) {
  const std::size_t bands = c.band_edges.size();
  return bands * sizeof(int) + c.q_lens.size() * c.batch_buckets.size() * bands * sizeof(unsigned long long);
}

namespace {

class SwitchGraphs final : public GraphCache {
 public:
  explicit SwitchGraphs(const CacheParts& parts) : GraphCache(parts), bands_(parts.plans.num_bands()) {
    const std::size_t edges_bytes = bands_ * sizeof(int);
    edges_ = static_cast<int*>(p_.memory.device(edges_bytes));
    p_.backend.upload(edges_, p_.cfg.band_edges.data(), edges_bytes);
    counts_ = static_cast<unsigned long long*>(
        p_.memory.device(switch_graphs_device_bytes(p_.cfg) - edges_bytes));  // zeroed
    for (int b = 0; b < p_.plans.num_buckets(); ++b) {
      GraphSlot g;
      g.plan = p_.plans.bucket_graph_plan(b);
      g.stats.graph_id = b;
      g.stats.batch = g.plan.batch;
      g.stats.q_len = g.plan.q_len;
      g.stats.band = 0;
      g.stats.last_band = bands_ - 1;
      g.stats.buckets = bands_;
      g.stats.switch_graph = true;
      slots_.push_back(std::move(g));
    }
  }

  // NOTE(graph): the bucket's graph reads the band off the staged lengths when it runs.
  StepGraph graph_for(int bucket, const Lengths& lens, const std::function<void()>& restage) override {
    StepGraph sg;
    sg.slot = &slots_[static_cast<std::size_t>(bucket)];
    if (!p_.plans.bucket_decided(bucket)) {  // kMeasured: every band's candidates, on synthetic inputs
      p_.measurer.measure_bucket(bucket);
      restage();  // this step's inputs again
      sg.result.measured = true;
    }
    if (!sg.slot->graph) {
      capture_bucket(bucket);
      sg.result.captured = true;
    }
    GraphSlot described;
    describe_step(bucket, lens, described, sg.result);
    return sg;
  }

  void capture_all() override {
    for (int b = 0; b < p_.plans.num_buckets(); ++b) {
      if (!p_.plans.bucket_decided(b)) p_.measurer.measure_bucket(b);
      if (!slots_[static_cast<std::size_t>(b)].graph) capture_bucket(b);
    }
  }

  void add_stats(ExecutorStats& s) const override {
    // The branch counters live in executor memory; one read for all buckets.
    std::vector<unsigned long long> counts;
    bool any = false;
    for (const GraphSlot& g : slots_) any = any || g.stats.captures > 0;
    if (any) {
      counts.resize(slots_.size() * bands_);
      if (!p_.backend.read_for_stats(counts.data(), counts_, counts.size() * sizeof(unsigned long long)))
        counts.clear();
    }
    for (const GraphSlot& g : slots_) {
      s.capture_ms += g.stats.capture_ms;
      s.instantiate_ms += g.stats.instantiate_ms;
      if (g.stats.captures == 0) continue;
      GraphStats gs = g.stats;
      gs.band_lo = g.plan.band_lo;
      gs.band_hi = g.plan.band_hi;
      gs.kernel = g.plan.kernel;
      gs.partition_size = g.plan.partition_size;
      std::set<int> distinct;  // step launches: bands identical in every layer group share a branch
      const std::size_t first = p_.plans.index(gs.graph_id, 0);
      gs.group_band_kernels.assign(static_cast<std::size_t>(p_.plans.num_groups()), {});
      for (int band = 0; band < bands_; ++band) {
        const BucketPlan& p = p_.plans.plan(first + band);
        distinct.insert(p.graph_id);
        gs.band_kernels.push_back(p.kernel);
        for (int g = 0; g < p_.plans.num_groups(); ++g)
          gs.group_band_kernels[static_cast<std::size_t>(g)].push_back(p_.plans.group_plan(g, first + band).kernel);
        if (!counts.empty()) gs.band_replays.push_back(static_cast<long long>(counts[first + band]));
      }
      for (const std::vector<KernelKind>& k : gs.group_band_kernels) gs.group_kernels.push_back(k.back());
      gs.branches = static_cast<int>(distinct.size());
      s.graphs.push_back(std::move(gs));
    }
    s.distinct_graphs = distinct_graphs();
  }
  int distinct_graphs() const override { return static_cast<int>(slots_.size()); }

 protected:
  void record(GraphSlot& slot) override {
    const int b = slot.stats.graph_id;
    kernels::BandSelectParams sel;
    sel.seq_lens = p_.targets.inputs.seq_lens;  // NOTE(graph): staged each step; padded rows are 0
    sel.batch = slot.plan.batch;
    sel.edges = edges_;
    sel.num_edges = bands_;
    sel.branch_counts = counts_ + static_cast<std::size_t>(b) * bands_;
    p_.recorder.record_switch(b, slot.plan, sel);
  }
  std::string kernel_text(const GraphSlot&) const override { return "every band"; }
  void describe_step(int bucket, const Lengths& lens, GraphSlot& target, StepResult& r) const override {
    target.stats.graph_id = bucket;
    target.plan = p_.plans.bucket_graph_plan(bucket);
    r.bucket = BucketIndex(p_.plans.batch_bucket_of(bucket));
    r.bucket_batch_size = p_.plans.plan(bucket, 0).batch;
    r.q_len = p_.plans.q_len_of(bucket);
    r.band_on_device = true;
    r.graph_id = bucket;
    r.band = -1;
    if (lens.max_len > 0) {  // the same choice the graph makes, from the same function
      const int band = kernels::select_band(lens.max_len, p_.cfg.band_edges.data(), bands_);
      const BucketPlan& p = p_.plans.plan(bucket, band);
      r.band = band;
      r.band_hi = p.band_hi;
      r.kernel = p.kernel;
      r.partition_size = p.partition_size;
    }
  }
  bool decided(int bucket, int) const override { return p_.plans.bucket_decided(bucket); }
  bool band_on_device() const override { return true; }

 private:
  void capture_bucket(int b) {
    GraphSlot& slot = slots_[static_cast<std::size_t>(b)];
    slot.plan = p_.plans.bucket_graph_plan(b);  // kMeasured may have moved it
    capture(slot, "batch bucket " + std::to_string(p_.plans.batch_bucket_of(b)) + " (batch " +
                      std::to_string(slot.plan.batch) + ", q_len " + std::to_string(slot.plan.q_len) +
                      ", every band; BandSelect::kDevice)");
  }

  const int bands_;
  int* edges_ = nullptr;                   // [bands] band edges (executor memory)
  unsigned long long* counts_ = nullptr;   // [(q_len, batch) buckets, bands] branch executions
};

}  // namespace

std::unique_ptr<GraphCache> make_switch_graphs(const CacheParts& parts) {
  return std::make_unique<SwitchGraphs>(parts);
}

}  // namespace decodegraph::detail
