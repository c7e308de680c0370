// BandSelect::kHost's graph cache (graph_cache.hpp): one graph per distinct step launch (every layer
// group's launch identical). The step's band is found on the host from its lengths (or the
// max_seq_len hint), and buckets whose launches are identical replay the same graph.
#include <algorithm>
#include <string>

#include "executor/graph_cache.hpp"

namespace decodegraph::detail {
namespace {

class PlanGraphs final : public GraphCache {
 public:
  explicit PlanGraphs(const CacheParts& parts) : GraphCache(parts) {}

  StepGraph graph_for(int bucket, const Lengths& lens, const std::function<void()>&) override {
    const std::size_t idx = p_.plans.index(bucket, p_.plans.band_of_length(lens.band_len));
    StepGraph sg;
    if (p_.plans.plan(idx).graph_id < 0) {  // kMeasured: time the candidates on this step's staged inputs
      p_.measurer.measure(idx);
      sg.result.measured = true;
    }
    sg.slot = &slot(p_.plans.plan(idx).graph_id);
    if (!sg.slot->graph) {
      capture_plan(idx);
      sg.result.captured = true;
    }
    GraphSlot described;
    describe_step(bucket, lens, described, sg.result);
    return sg;
  }

  void capture_all() override {
    for (std::size_t i = 0; i < p_.plans.num_cells(); ++i) {
      if (p_.plans.plan(i).graph_id < 0) p_.measurer.measure_synthetic(i);
      if (!slot(p_.plans.plan(i).graph_id).graph) capture_plan(i);
    }
  }

  void add_stats(ExecutorStats& s) const override {
    for (std::size_t id = 0; id < slots_.size(); ++id) {
      const GraphSlot& g = slots_[id];
      s.capture_ms += g.stats.capture_ms;
      s.instantiate_ms += g.stats.instantiate_ms;
      if (g.stats.captures == 0) continue;
      GraphStats gs = g.stats;
      describe(static_cast<int>(id), gs);
      s.graphs.push_back(gs);
    }
    s.distinct_graphs = distinct_graphs();
  }
  int distinct_graphs() const override { return static_cast<int>(p_.plans.launches().size()); }

 protected:
  void record(GraphSlot& s) override {
    const PlanBook::Launch& l = p_.plans.launches()[static_cast<std::size_t>(s.stats.graph_id)];
    s.plan = l.plan();  // kMeasured may have widened it
    p_.recorder.record(l.plans);
  }
  std::string kernel_text(const GraphSlot& s) const override { return to_string(s.plan.kernel); }
  void describe_step(int bucket, const Lengths& lens, GraphSlot& target, StepResult& r) const override {
    const BucketPlan& plan = p_.plans.plan(bucket, p_.plans.band_of_length(lens.band_len));
    target.stats.graph_id = plan.graph_id;
    target.plan = plan;  // record() takes the launch's plan
    r.bucket = BucketIndex(p_.plans.batch_bucket_of(bucket));
    r.bucket_batch_size = plan.batch;
    r.q_len = plan.q_len;
    r.band = plan.band;
    r.band_hi = plan.band_hi;
    r.kernel = plan.kernel;
    r.partition_size = plan.partition_size;
    r.graph_id = plan.graph_id;
  }
  bool decided(int bucket, int band_len) const override {
    return p_.plans.plan(bucket, p_.plans.band_of_length(band_len)).graph_id >= 0;
  }
  bool band_on_device() const override { return false; }

 private:
  /// The slot of launch `id` (launches grow as kMeasured decides buckets).
  GraphSlot& slot(int id) {
    while (slots_.size() < p_.plans.launches().size()) {
      slots_.emplace_back();
      slots_.back().stats.graph_id = static_cast<int>(slots_.size()) - 1;
    }
    GraphSlot& g = slots_[static_cast<std::size_t>(id)];
    describe(id, g.stats);
    return g;
  }

  // The graph's fields that follow from its launch: its buckets, bands and kernel.
  void describe(int id, GraphStats& gs) const {
    const PlanBook::Launch& l = p_.plans.launches()[static_cast<std::size_t>(id)];
    const BucketPlan& p = l.plan();
    gs.graph_id = id;
    gs.batch = p.batch;
    gs.q_len = p.q_len;
    gs.band = p.band;
    gs.last_band = p.band;
    for (std::size_t cell : l.buckets) gs.last_band = std::max(gs.last_band, p_.plans.plan(cell).band);
    gs.band_lo = p.band_lo;
    gs.band_hi = p.band_hi;
    gs.buckets = static_cast<int>(l.buckets.size());
    gs.kernel = p.kernel;
    gs.partition_size = p.partition_size;
    gs.group_kernels.clear();
    for (const BucketPlan& g : l.plans) gs.group_kernels.push_back(g.kernel);
    gs.measure_ms = l.measure_ms;
  }

  void capture_plan(std::size_t idx) {
    const BucketPlan& p = p_.plans.plan(idx);
    capture(slot(p.graph_id), "bucket (batch " + std::to_string(p.batch) + ", q_len " + std::to_string(p.q_len) +
                                  ", band " + std::to_string(p.band) +
                                  ", graph " + std::to_string(p.graph_id) + ")");
  }
};

}  // namespace

std::unique_ptr<GraphCache> make_plan_graphs(const CacheParts& parts) { return std::make_unique<PlanGraphs>(parts); }

}  // namespace decodegraph::detail
