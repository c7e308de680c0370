// What both graph-cache strategies share (graph_cache.hpp): capture with the memory budget, the
// rebind re-capture and update.
#include "executor/graph_cache.hpp"

#include <spdlog/spdlog.h>

#include <chrono>

#include "decodegraph/error.hpp"
#include "executor/log.hpp"
#include "executor/nvtx.hpp"
#include "executor/scoped.hpp"

namespace decodegraph::detail {

std::size_t GraphCache::bytes() const {
  std::size_t n = 0;
  for (const GraphSlot& s : slots_)
    if (s.graph) n += s.graph->bytes();
  return n;
}

// Static buffers and workspace are checked against memory_budget_bytes at construction; graph
// memory is known only once a graph is captured, so it is checked here, before the graph is kept.
// With CapturePolicy::kUpFront an over-budget graph therefore fails construction; with kLazy the
// step that first needs it throws. Executor memory only grows (graphs are never freed), so a
// rejected graph can never fit later: capture() remembers it and throws the same error at once,
// without capturing it again.
void GraphCache::check_budget(const std::string& what, std::size_t bytes) const {
  if (p_.ledger.budget == 0) return;
  const std::size_t total = p_.ledger.static_bytes + p_.ledger.workspace_bytes + this->bytes() + bytes;
  if (total > p_.ledger.budget)
    throw_invalid("memory_budget_bytes", p_.ledger.budget,
                  ">= " + std::to_string(total) + " bytes to hold the graph of " + what + ", or 0 for unlimited");
}

void GraphCache::capture(GraphSlot& slot, const std::string& what) {
  if (slot.rejected_bytes != 0) check_budget(what, slot.rejected_bytes);  // throws
  NvtxRange range("decodegraph::capture");
  const auto t0 = std::chrono::steady_clock::now();
  p_.backend.begin_capture();
  AbortCapture abort{&p_.backend};
  record(slot);
  const double capture_ms = ms_since(t0);
  abort.armed = false;  // end_capture_and_instantiate ends the capture on every path
  const auto t1 = std::chrono::steady_clock::now();
  std::unique_ptr<BackendGraph> g = p_.backend.end_capture_and_instantiate();
  const double inst_ms = ms_since(t1);
  try {
    check_budget(what, g->bytes());
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
  ++total_captures_;
  p_.log->info("captured {}graph {} for batch {} lengths ({},{}] {} ({} buckets): {} nodes, capture {:.3f} ms, "
               "instantiate {:.3f} ms, graph memory {}",
               s.switch_graph ? "SWITCH " : "", s.graph_id, slot.plan.batch, slot.plan.band_lo, slot.plan.band_hi,
               kernel_text(slot), s.buckets, s.nodes, capture_ms, inst_ms, mib(s.bytes));
}

std::vector<GraphCache::Rebound> GraphCache::recapture() {
  std::vector<Rebound> pending;
  for (GraphSlot& slot : slots_) {
    if (!slot.graph) continue;
    p_.backend.begin_capture();
    AbortCapture abort{&p_.backend};
    record(slot);
    abort.armed = false;
    pending.push_back(Rebound{&slot, p_.backend.end_capture()});
  }
  return pending;
}

GraphCache::RebindResult GraphCache::apply(std::vector<Rebound>& pending) {
  RebindResult r;
  for (Rebound& rb : pending) {
    GraphSlot& slot = *rb.slot;
    try {
      if (p_.backend.update(*slot.graph, *rb.captured)) {
        ++slot.stats.updates;
        ++r.updated;
      } else {
        ++slot.stats.reinstantiations;
        ++r.reinstantiated;
      }
      slot.stats.nodes = slot.graph->nodes();
      slot.stats.bytes = slot.graph->bytes();
    } catch (...) {
      if (!r.first_error) r.first_error = std::current_exception();
      slot.graph.reset();
      ++r.dropped;
    }
  }
  return r;
}

}  // namespace decodegraph::detail
