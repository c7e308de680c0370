// The CUDA backend's graphs (cuda_backend.hpp): our captures of the own stream (graphs::CaptureScope),
// recording into a caller's capture of the step's stream, instantiation, update, launch and the
// timing of replays. The SWITCH nodes a capture holds are cuda_switch.cpp's.
//
// rebind_layers re-captures a SWITCH graph and re-instantiates it (update() below), never
// cudaGraphExecUpdate: the re-capture creates new conditional handles, and the documentation does not
// say whether an update rebinds a conditional node to a new handle. If it kept the old binding, the
// new band-select node would set handles no node reads, and every band would run a stale branch.
//
// Uploads: every instantiation (and re-instantiation on rebind) is followed by cudaGraphUpload on
// the step's stream, so the graph's first replay does not also pay for moving it to the device.
#include "executor/cuda/cuda_backend.hpp"

#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <utility>

#include "decodegraph/error.hpp"
#include "graphs/graph.hpp"
#include "kernels/cuda_check.hpp"

namespace decodegraph::detail {
namespace {

class CudaCaptured final : public CapturedGraph {
 public:
  CudaCaptured(graphs::Graph g, int branch, bool conditional)
      : graph(std::move(g)), branch_nodes(branch), has_switch(conditional) {}
  graphs::Graph graph;
  int branch_nodes = 0;  // nodes inside SWITCH bodies (cudaGraphGetNodes counts the top level only)
  bool has_switch = false;  // holds SWITCH nodes: rebinding re-instantiates it (file comment)
};

class CudaGraph final : public BackendGraph {
 public:
  CudaGraph(graphs::Graph g, graphs::GraphExec e, int branch_nodes)
      : graph_(std::move(g)), exec_(std::move(e)), nodes_(graph_.nodes() + branch_nodes) {}
  int nodes() const override { return nodes_; }
  std::size_t bytes() const override { return graphs::estimate_graph_bytes(nodes_); }
  void launch(cudaStream_t s) const { exec_.launch(s); }
  const graphs::GraphExec& exec() const { return exec_; }
  /// True when updated in place; `reinstantiate` skips the in-place attempt. On a failed
  /// re-instantiation exec_ keeps the old graph.
  bool update(graphs::Graph g, int branch_nodes, bool reinstantiate) {
    bool in_place = false;
    if (reinstantiate)
      exec_ = graphs::GraphExec::instantiate(g);
    else
      in_place = exec_.update(g);
    nodes_ = g.nodes() + branch_nodes;
    graph_ = std::move(g);
    return in_place;
  }

 private:
  graphs::Graph graph_;
  graphs::GraphExec exec_;
  int nodes_ = 0;
};

}  // namespace

void CudaBackend::begin_capture() {
  if (scope_) throw Error("cudaStreamBeginCapture failed: a capture is already active on the executor stream");
  if (recording_caller_) throw Error("cudaStreamBeginCapture refused: recording into the caller's capture");
  scope_.emplace(stream_);
}

std::unique_ptr<CapturedGraph> CudaBackend::end_capture() {
  const bool open_switch = sw_.active;
  const int branch_nodes = branch_nodes_;
  const BandSelectNode bs = std::move(bs_);
  reset_switch_state();
  graphs::Graph g = take_graph();
  if (open_switch) throw Error("cudaStreamEndCapture: a SWITCH node of the capture is still open");
  set_band_select_handles(bs.node, bs.params);
  return std::make_unique<CudaCaptured>(std::move(g), branch_nodes, bs.params.num_handles > 0);
}

std::unique_ptr<BackendGraph> CudaBackend::instantiate(CapturedGraph& captured) {
  auto& c = static_cast<CudaCaptured&>(captured);
  graphs::GraphExec e = graphs::GraphExec::instantiate(c.graph);
  upload_graph(e);
  return std::make_unique<CudaGraph>(std::move(c.graph), std::move(e), c.branch_nodes);
}

bool CudaBackend::update(BackendGraph& exec, CapturedGraph& captured) {
  auto& c = static_cast<CudaCaptured&>(captured);
  auto& g = static_cast<CudaGraph&>(exec);
  const bool in_place = g.update(std::move(c.graph), c.branch_nodes, /*reinstantiate=*/c.has_switch);
  if (!in_place) upload_graph(g.exec());  // re-instantiated: a new executable to move to the device
  return in_place;
}

void CudaBackend::abort_capture() noexcept {
  if (sw_.active && sw_.branch >= 0 && sw_.fresh) {  // a branch capture is open on branch_stream_
    cudaGraph_t g = nullptr;
    (void)cudaStreamEndCapture(branch_stream_, &g);  // g is the SWITCH node's body: not ours to destroy
    (void)cudaGetLastError();
  }
  reset_switch_state();
  if (recording_caller_) {
    recording_caller_ = false;  // the caller's capture stays open: only ours is abandoned
    return;
  }
  scope_.reset();
}

void CudaBackend::begin_caller_capture() {
  if (!caller_ || scope_ || recording_caller_)
    throw Error("recording into the caller's capture: the step's stream is not being captured, or a capture is open");
  reset_switch_state();
  recording_caller_ = true;
}

void CudaBackend::end_caller_capture() {
  if (!recording_caller_) throw Error("recording into the caller's capture: none open");
  const bool open_switch = sw_.active;
  const BandSelectNode bs = std::move(bs_);
  reset_switch_state();
  recording_caller_ = false;
  if (open_switch) throw Error("recording into the caller's capture: a SWITCH node is still open");
  set_band_select_handles(bs.node, bs.params);
}

void CudaBackend::launch(BackendGraph& g) { static_cast<CudaGraph&>(g).launch(cur_); }

double CudaBackend::time_replays(BackendGraph& g, int replays) {
  // Never inside a capture: event timing and the synchronisation below are not capturable.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DG_CUDA_CHECK(cudaStreamIsCapturing(cur_, &status));
  if (scope_ || status != cudaStreamCaptureStatusNone)
    throw Error("kMeasured timing refused: the step's stream is being captured");
  // On the step's stream, after this step's staging: the warm-up also absorbs whatever was queued
  // there before, so the events time the replays alone.
  launch(g);  // warm-up
  DG_CUDA_CHECK(cudaEventRecord(timing_[0], cur_));
  for (int i = 0; i < replays; ++i) launch(g);
  DG_CUDA_CHECK(cudaEventRecord(timing_[1], cur_));
  DG_CUDA_CHECK(cudaEventSynchronize(timing_[1]));
  float ms = 0;
  DG_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_[0], timing_[1]));
  return 1000.0 * ms / (replays > 0 ? replays : 1);
}

graphs::Graph CudaBackend::take_graph() {
  if (!scope_) throw Error("cudaStreamEndCapture failed: no capture is active on the executor stream");
  // end() finishes the capture on every path; reset the scope whatever happens.
  struct Reset {
    std::optional<graphs::CaptureScope>& s;
    ~Reset() { s.reset(); }
  } reset{scope_};
  return scope_->end();
}

// cudaGraphUpload on the step's stream (its first launch follows there, in order).
void CudaBackend::upload_graph(const graphs::GraphExec& e) { DG_CUDA_CHECK(cudaGraphUpload(e.get(), cur_)); }

}  // namespace decodegraph::detail
