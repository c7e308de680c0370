// RAII over CUDA graphs: Graph (cudaGraph_t), GraphExec (cudaGraphExec_t), a CaptureScope that always
// ends its capture, instantiation that reports CUDA's failure details, and in-place update that
// falls back to re-instantiation. Every CUDA call first consults fault::should_fail(site).
// CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

namespace decodegraph::graphs {

class Graph {
 public:
  Graph() = default;
  explicit Graph(cudaGraph_t g) : g_(g) {}
  ~Graph() { reset(); }
  Graph(Graph&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
  Graph& operator=(Graph&& o) noexcept {
    if (this != &o) {
      reset();
      g_ = std::exchange(o.g_, nullptr);
    }
    return *this;
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  cudaGraph_t get() const { return g_; }
  explicit operator bool() const { return g_ != nullptr; }
  /// Number of nodes (kernels, copies, ...) in the graph.
  int nodes() const;
  void reset() noexcept;

 private:
  cudaGraph_t g_ = nullptr;
};

class GraphExec {
 public:
  GraphExec() = default;
  ~GraphExec() { reset(); }
  GraphExec(GraphExec&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;

  /// cudaGraphInstantiateWithParams; on failure throws Error with the instantiate result and the
  /// type of the offending node. Site kInstantiate.
  static GraphExec instantiate(const Graph& graph);
  /// Applies `graph` in place (cudaGraphExecUpdate, site kGraphUpdate); when CUDA refuses (topology
  /// changed) or the update fault fires, re-instantiates instead. Returns true if updated in place.
  bool update(const Graph& graph);
  /// cudaGraphLaunch on `stream`. Site kGraphLaunch.
  void launch(cudaStream_t stream) const;

  cudaGraphExec_t get() const { return e_; }
  explicit operator bool() const { return e_ != nullptr; }
  void reset() noexcept;

 private:
  cudaGraphExec_t e_ = nullptr;
};

/// Captures `stream` from construction (cudaStreamBeginCapture, thread-local mode; site
/// kCaptureBegin) until end(). If end() is never reached (an exception escaped the captured code)
/// the destructor ends the capture and discards the graph, leaving the stream usable.
class CaptureScope {
 public:
  explicit CaptureScope(cudaStream_t stream);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

  /// Ends the capture and returns the graph (site kCaptureEnd). The capture is over afterwards on
  /// every path, including when this throws.
  Graph end();
  bool active() const { return active_; }

 private:
  cudaStream_t stream_;
  bool active_ = false;
};

/// What instantiation's error text says of a cudaGraphInstantiateResult and of the offending node's
/// type: the enumerator's name and its meaning (a value newer than this build: its number).
std::string instantiate_result_text(cudaGraphInstantiateResult r);
std::string node_type_text(cudaGraphNodeType t);

/// Device memory a graph holds: an estimate. cudaDeviceGetGraphMemAttribute reports only memory of
/// graph allocation nodes, which our graphs never contain (all buffers are allocated up front), and
/// the driver exposes no per-executable footprint. Each node is charged kNodeBytesEstimate for its
/// launch parameters and driver bookkeeping (an order of magnitude, not measured).
inline constexpr std::size_t kNodeBytesEstimate = 1024;
std::size_t estimate_graph_bytes(int nodes);

}  // namespace decodegraph::graphs
