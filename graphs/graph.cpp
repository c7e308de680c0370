// RAII over CUDA graphs (see graph.hpp).
#include "graphs/graph.hpp"

#include <string>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "kernels/cuda_check.hpp"

namespace decodegraph::graphs {
namespace {

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

}  // namespace

// Every value of the CUDA 13.0 headers, by its enumerator name and what it means; a newer value
// reads as its number.
std::string instantiate_result_text(cudaGraphInstantiateResult r) {
  switch (r) {
    case cudaGraphInstantiateSuccess: return "cudaGraphInstantiateSuccess";
    case cudaGraphInstantiateError: return "cudaGraphInstantiateError (an unexpected failure)";
    case cudaGraphInstantiateInvalidStructure: return "cudaGraphInstantiateInvalidStructure (e.g. a cycle)";
    case cudaGraphInstantiateNodeOperationNotSupported:
      return "cudaGraphInstantiateNodeOperationNotSupported (a node's operation is not supported)";
    case cudaGraphInstantiateMultipleDevicesNotSupported:
      return "cudaGraphInstantiateMultipleDevicesNotSupported (nodes of several contexts)";
    case cudaGraphInstantiateConditionalHandleUnused:
      return "cudaGraphInstantiateConditionalHandleUnused (a conditional handle no conditional node uses)";
  }
  return "result " + std::to_string(static_cast<int>(r)) + " (unknown to this build)";
}

std::string node_type_text(cudaGraphNodeType t) {
  const char* what = nullptr;
  const char* name = nullptr;
  switch (t) {
    case cudaGraphNodeTypeKernel: what = "kernel", name = "cudaGraphNodeTypeKernel"; break;
    case cudaGraphNodeTypeMemcpy: what = "memcpy", name = "cudaGraphNodeTypeMemcpy"; break;
    case cudaGraphNodeTypeMemset: what = "memset", name = "cudaGraphNodeTypeMemset"; break;
    case cudaGraphNodeTypeHost: what = "host", name = "cudaGraphNodeTypeHost"; break;
    case cudaGraphNodeTypeGraph: what = "child graph", name = "cudaGraphNodeTypeGraph"; break;
    case cudaGraphNodeTypeEmpty: what = "empty", name = "cudaGraphNodeTypeEmpty"; break;
    case cudaGraphNodeTypeWaitEvent: what = "event wait", name = "cudaGraphNodeTypeWaitEvent"; break;
    case cudaGraphNodeTypeEventRecord: what = "event record", name = "cudaGraphNodeTypeEventRecord"; break;
    case cudaGraphNodeTypeExtSemaphoreSignal:
      what = "external semaphore signal", name = "cudaGraphNodeTypeExtSemaphoreSignal";
      break;
    case cudaGraphNodeTypeExtSemaphoreWait:
      what = "external semaphore wait", name = "cudaGraphNodeTypeExtSemaphoreWait";
      break;
    case cudaGraphNodeTypeMemAlloc: what = "memory allocation", name = "cudaGraphNodeTypeMemAlloc"; break;
    case cudaGraphNodeTypeMemFree: what = "memory free", name = "cudaGraphNodeTypeMemFree"; break;
    case cudaGraphNodeTypeConditional: what = "conditional", name = "cudaGraphNodeTypeConditional"; break;
    default: return "node of unknown type " + std::to_string(static_cast<int>(t));
  }
  return std::string(what) + " node (" + name + " = " + std::to_string(static_cast<int>(t)) + ")";
}

int Graph::nodes() const {
  if (!g_) return 0;
  size_t n = 0;
  DG_CUDA_CHECK(cudaGraphGetNodes(g_, nullptr, &n));
  return static_cast<int>(n);
}

void Graph::reset() noexcept {
  if (g_) cudaGraphDestroy(g_);
  g_ = nullptr;
}

GraphExec GraphExec::instantiate(const Graph& graph) {
  require(static_cast<bool>(graph), "graph", "null", "a captured graph");
  if (fault::should_fail(fault::Site::kInstantiate)) injected("cudaGraphInstantiate", fault::Site::kInstantiate);
  cudaGraphInstantiateParams params{};
  params.flags = 0;
  GraphExec e;
  const cudaError_t err = cudaGraphInstantiateWithParams(&e.e_, graph.get(), &params);
  if (err != cudaSuccess || params.result_out != cudaGraphInstantiateSuccess) {
    (void)cudaGetLastError();  // instantiate errors are not sticky; clear for the next call
    std::string node = "none reported";
    if (params.errNode_out) {
      cudaGraphNodeType type;
      if (cudaGraphNodeGetType(params.errNode_out, &type) == cudaSuccess) node = node_type_text(type);
      (void)cudaGetLastError();
    }
    e.reset();
    // result_out stays at its zero value (success) when the driver rejects the call before filling it.
    const std::string result =
        params.result_out == cudaGraphInstantiateSuccess ? "not reported" : instantiate_result_text(params.result_out);
    const std::string msg = std::string("cudaGraphInstantiate failed: ") + cudaGetErrorName(err) + " (" +
                            cudaGetErrorString(err) + "), result: " + result + ", offending node: " + node;
    if (err == cudaErrorMemoryAllocation) throw OutOfMemory(msg);
    throw CudaError(msg, err != cudaSuccess ? err : cudaErrorUnknown);
  }
  return e;
}

bool GraphExec::update(const Graph& graph) {
  require(static_cast<bool>(graph), "graph", "null", "a captured graph");
  if (e_ && !fault::should_fail(fault::Site::kGraphUpdate)) {
    cudaGraphExecUpdateResultInfo info{};
    const cudaError_t err = cudaGraphExecUpdate(e_, graph.get(), &info);
    if (err == cudaSuccess && info.result == cudaGraphExecUpdateSuccess) return true;
    (void)cudaGetLastError();  // a refused update is not sticky; clear it and re-instantiate
  }
  GraphExec fresh = instantiate(graph);  // on failure the old executable stays valid
  *this = std::move(fresh);
  return false;
}

void GraphExec::launch(cudaStream_t stream) const {
  require(e_ != nullptr, "graph exec", "null", "an instantiated graph");
  if (fault::should_fail(fault::Site::kGraphLaunch)) injected("cudaGraphLaunch", fault::Site::kGraphLaunch);
  DG_CUDA_CHECK(cudaGraphLaunch(e_, stream));
}

void GraphExec::reset() noexcept {
  if (e_) cudaGraphExecDestroy(e_);
  e_ = nullptr;
}

CaptureScope::CaptureScope(cudaStream_t stream) : stream_(stream) {
  if (fault::should_fail(fault::Site::kCaptureBegin))
    injected("cudaStreamBeginCapture", fault::Site::kCaptureBegin);
  DG_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  active_ = true;
}

CaptureScope::~CaptureScope() {
  if (!active_) return;
  // An exception escaped the captured code: end the capture (possibly invalidated) and drop the
  // partial graph, so the stream leaves capture mode and stays usable.
  cudaGraph_t g = nullptr;
  (void)cudaStreamEndCapture(stream_, &g);
  if (g) cudaGraphDestroy(g);
  (void)cudaGetLastError();
}

Graph CaptureScope::end() {
  require(active_, "capture", "inactive", "end() once per capture");
  active_ = false;
  cudaGraph_t g = nullptr;
  const cudaError_t err = cudaStreamEndCapture(stream_, &g);
  Graph graph(g);  // owned from here: destroyed on every failure below
  if (fault::should_fail(fault::Site::kCaptureEnd)) injected("cudaStreamEndCapture", fault::Site::kCaptureEnd);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(std::string("cudaStreamEndCapture failed: ") + cudaGetErrorName(err) + " (" +
                        cudaGetErrorString(err) + "); the capture was invalidated by an operation inside it",
                    err);
  }
  if (!graph) throw CudaError("cudaStreamEndCapture failed: returned no graph", cudaErrorUnknown);
  return graph;
}

std::size_t estimate_graph_bytes(int nodes) { return static_cast<std::size_t>(nodes) * kNodeBytesEstimate; }

}  // namespace decodegraph::graphs
