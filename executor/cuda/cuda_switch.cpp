// The CUDA backend's band-select and SWITCH nodes (cuda_backend.hpp).
//
// Band choice in the graph (BandSelect::kDevice): band_select() launches the band-select kernel into
// the capture and remembers its node; each begin_switch() creates a conditional handle on the
// captured graph and adds a SWITCH node after the current capture dependencies
// (cudaStreamGetCaptureInfo, cudaGraphAddNode, cudaStreamUpdateCaptureDependencies). A branch is
// recorded by capturing a second stream into the node's body graph (cudaStreamBeginCaptureToGraph);
// a branch whose launches equal an earlier branch's is a child-graph node cloned from that body
// (the driver copies a child graph, so it is captured once but still instantiated per branch).
// When the capture ends, the handles are written into the band-select node's parameters, so one
// kernel sets every SWITCH node of the graph. One handle per node: the API documents a handle as
// belonging to one conditional node, so sharing one is not relied upon.
//
// In a caller's capture the band-select node and the SWITCH nodes are added to the caller's capture
// graph exactly as to ours, and end_caller_capture() writes the handles into the band-select node, a
// change to an existing node that the runtime allows while the capture is in progress
// (cudaStreamGetCaptureInfo: every operation on the graph but destroying it and removing nodes).
#include "executor/cuda/cuda_backend.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "decodegraph/error.hpp"
#include "kernels/band_select.cuh"
#include "kernels/cuda_check.hpp"

namespace decodegraph::detail {
namespace {

// Nodes of a (body) graph; 0 if the driver cannot say.
int count_nodes(cudaGraph_t g) {
  std::size_t n = 0;
  if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<int>(n);
}

}  // namespace

void CudaBackend::band_select(const kernels::BandSelectParams& p) {
  if (!(scope_ || recording_caller_) || sw_.active) throw Error("band select: record it in a capture, outside SWITCH nodes");
  kernels::BandSelectParams params = p;
  params.num_handles = 0;  // filled in at end_capture
  clear_leftover("the band-select launch");
  kernels::launch_band_select(params, top());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  std::size_t ndeps = 0;
  DG_CUDA_CHECK(cudaStreamGetCaptureInfo(top(), &status, nullptr, &graph, &deps, nullptr, &ndeps));
  if (status != cudaStreamCaptureStatusActive || ndeps != 1)
    throw Error("band select: the kernel node is not the capture's only dependency (" + std::to_string(ndeps) + ")");
  bs_.node = deps[0];
  bs_.params = params;
  graph_ = graph;
}

void CudaBackend::begin_switch(int branches) {
  if (!(scope_ || recording_caller_) || sw_.active) throw Error("SWITCH node: no capture, or one already open");
  if (!bs_.node) throw Error("SWITCH node: no band-select node before it in this capture");
  if (bs_.params.num_handles >= kernels::kMaxSwitchHandles)
    throw Error("SWITCH node: more than " + std::to_string(kernels::kMaxSwitchHandles) + " in one graph");
  cudaGraphConditionalHandle handle = 0;
  DG_CUDA_CHECK(cudaGraphConditionalHandleCreate(&handle, graph_, 0, 0));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  std::size_t ndeps = 0;
  DG_CUDA_CHECK(cudaStreamGetCaptureInfo(top(), &status, nullptr, nullptr, &deps, &edges, &ndeps));
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeSwitch;
  params.conditional.size = static_cast<unsigned>(branches);
  cudaGraphNode_t node = nullptr;
  DG_CUDA_CHECK(cudaGraphAddNode(&node, graph_, deps, edges, ndeps, &params));
  // NOTE(graph): what the capture records next (later layers, the flag copy) runs after the node.
  DG_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(top(), &node, nullptr, 1, cudaStreamSetCaptureDependencies));
  bs_.params.handles[bs_.params.num_handles++] = handle;
  sw_.active = true;
  sw_.bodies.assign(params.conditional.phGraph_out, params.conditional.phGraph_out + branches);
  sw_.by_key.clear();
  sw_.branch = -1;
}

bool CudaBackend::begin_branch(int branch, int key) {
  if (!sw_.active || sw_.branch >= 0 || branch < 0 || branch >= static_cast<int>(sw_.bodies.size()))
    throw Error("SWITCH branch: no open SWITCH node, a branch already open, or branch out of range");
  sw_.branch = branch;
  sw_.fresh = false;
  if (auto it = sw_.by_key.find(key); it != sw_.by_key.end()) {
    cudaGraphNode_t child = nullptr;
    DG_CUDA_CHECK(cudaGraphAddChildGraphNode(&child, sw_.bodies[branch], nullptr, 0, sw_.bodies[it->second]));
    branch_nodes_ += 1 + count_nodes(sw_.bodies[it->second]);
    return false;
  }
  sw_.by_key.emplace(key, branch);
  DG_CUDA_CHECK(cudaStreamBeginCaptureToGraph(branch_stream_, sw_.bodies[branch], nullptr, nullptr, 0,
                                              cudaStreamCaptureModeThreadLocal));
  sw_.fresh = true;
  return true;
}

void CudaBackend::end_branch() {
  if (!sw_.active || sw_.branch < 0) throw Error("SWITCH branch end: no branch open");
  const int b = sw_.branch;
  const bool fresh = sw_.fresh;
  sw_.branch = -1;
  sw_.fresh = false;
  if (fresh) {
    cudaGraph_t g = nullptr;
    DG_CUDA_CHECK(cudaStreamEndCapture(branch_stream_, &g));  // g == the body: owned by the node
    branch_nodes_ += count_nodes(sw_.bodies[b]);
  }
}

void CudaBackend::end_switch() {
  if (!sw_.active || sw_.branch >= 0) throw Error("SWITCH node end: no SWITCH node open, or a branch still open");
  sw_ = {};
}

// NOTE(graph): the band-select node sets every SWITCH handle created in its capture (ours, or the
// caller's still in progress: changing a node's parameters is allowed then, see the file comment).
void CudaBackend::set_band_select_handles(cudaGraphNode_t node, kernels::BandSelectParams params) {
  if (!node || params.num_handles == 0) return;
  cudaKernelNodeParams kp{};
  DG_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &kp));
  void* args[] = {&params};
  kp.kernelParams = args;
  kp.extra = nullptr;
  DG_CUDA_CHECK(cudaGraphKernelNodeSetParams(node, &kp));
}

void CudaBackend::reset_switch_state() noexcept {
  sw_ = {};
  bs_ = {};
  graph_ = nullptr;
  branch_nodes_ = 0;
}

}  // namespace decodegraph::detail
