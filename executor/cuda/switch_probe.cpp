// Whether SWITCH nodes work here (cuda_backend.hpp, Backend::switch_supported): the driver and
// runtime versions, then probe graphs built as capture builds a bucket graph, once per process and
// outside any capture. Every error is cleared and reported as the reason, never thrown, and the
// probe uses the real calls, not the fault seam, so a test's injected fault is left for the code
// under test.
#include "executor/cuda/cuda_backend.hpp"

#include <cuda_runtime.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "kernels/band_select.cuh"
#include "kernels/cuda_check.hpp"

namespace decodegraph::detail {
namespace {

std::pair<bool, std::string> probe_switch() noexcept;
std::string probe_switch_capture() noexcept;

}  // namespace

bool CudaBackend::switch_supported(std::string& why) {
  static std::mutex mutex;
  static std::optional<std::pair<bool, std::string>> probed;  // once per process
  std::lock_guard<std::mutex> lock(mutex);
  if (!probed) {
    // Not the probe's own error, so never cached as its answer.
    const cudaError_t pending = cudaGetLastError();
    if (pending != cudaSuccess) {
      log_leftover(pending, "the SWITCH probe");
      if (cuda_error_is_sticky(pending)) {
        why = std::string("the CUDA context was lost before the SWITCH probe (") + cudaGetErrorName(pending) + ")";
        return false;
      }
    }
    probed = probe_switch();
  }
  why = probed->second;
  return probed->first;
}

namespace {

// Driver and runtime versions, then a graph with a SWITCH node (an empty node in each body) that
// must instantiate, then the capture path end to end (probe_switch_capture). Outside any capture;
// every error is cleared and reported, never thrown.
std::pair<bool, std::string> probe_switch() noexcept {
  int drv = 0, rt = 0;
  if (cudaDriverGetVersion(&drv) != cudaSuccess || cudaRuntimeGetVersion(&rt) != cudaSuccess) {
    (void)cudaGetLastError();
    return {false, "cudaDriverGetVersion / cudaRuntimeGetVersion failed"};
  }
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  if (drv < 12080 || rt < 12080)
    return {false, "driver " + version(drv) + ", runtime " + version(rt) + "; SWITCH nodes need 12.8 or newer"};
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  std::string failed;
  auto step = [&](cudaError_t err, const char* call) {
    if (err == cudaSuccess || !failed.empty()) return err == cudaSuccess && failed.empty();
    failed = std::string("probe: ") + call + " returned " + cudaGetErrorName(err);
    (void)cudaGetLastError();
    return false;
  };
  if (step(cudaGraphCreate(&g, 0), "cudaGraphCreate")) {
    cudaGraphConditionalHandle h = 0;
    cudaGraphNodeParams p{};
    cudaGraphNode_t n = nullptr;
    if (step(cudaGraphConditionalHandleCreate(&h, g, 0, 0), "cudaGraphConditionalHandleCreate")) {
      p.type = cudaGraphNodeTypeConditional;
      p.conditional.handle = h;
      p.conditional.type = cudaGraphCondTypeSwitch;
      p.conditional.size = 2;
      if (step(cudaGraphAddNode(&n, g, nullptr, nullptr, 0, &p), "cudaGraphAddNode(SWITCH)")) {
        for (int i = 0; i < 2; ++i) {
          cudaGraphNode_t empty = nullptr;
          step(cudaGraphAddEmptyNode(&empty, p.conditional.phGraph_out[i], nullptr, 0), "cudaGraphAddEmptyNode");
        }
        step(cudaGraphInstantiate(&e, g, 0), "cudaGraphInstantiate");
      }
    }
  }
  if (e) (void)cudaGraphExecDestroy(e);
  if (g) (void)cudaGraphDestroy(g);
  if (!failed.empty()) return {false, failed};
  failed = probe_switch_capture();
  if (!failed.empty()) return {false, failed};
  return {true, ""};
}

// The whole mechanism a bucket graph relies on, end to end, the way capture builds it: a stream
// capture holding the band-select kernel; a SWITCH node added to the capture; branches 0 and 1
// captured into their bodies from a second stream, branch 2 a child-graph clone of branch 0; the
// handle patched into the captured kernel node; instantiate; two replays with lengths of bands 1
// and 2, each checked by the value its branch wrote. The real calls, not the fault seam: a test's
// injected fault is left for the code under test. Returns what failed, or "".
std::string probe_switch_capture() noexcept {
  (void)cudaGetLastError();  // a failed clean-up of probe_switch's graph: not this part's launches
  cudaStream_t s = nullptr, s2 = nullptr;
  int* d = nullptr;  // [0] the length, [1..3] band edges, [4] the mark a branch writes
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  bool capturing = false, capturing2 = false;
  std::string failed;
  auto ok = [&](cudaError_t err, const char* call) {
    if (err == cudaSuccess) return true;
    failed = std::string("probe: ") + call + " returned " + cudaGetErrorName(err);
    return false;
  };
  do {
    if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") ||
        !ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") ||
        !ok(cudaMalloc(reinterpret_cast<void**>(&d), 8 * sizeof(int)), "cudaMalloc"))
      break;
    const int init[5] = {12, 8, 16, 24, -1};
    if (!ok(cudaMemcpyAsync(d, init, sizeof init, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync") ||
        !ok(cudaStreamSynchronize(s), "cudaStreamSynchronize"))
      break;
    if (!ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture")) break;
    capturing = true;
    kernels::BandSelectParams p;
    p.seq_lens = d;
    p.batch = 1;
    p.edges = d + 1;
    p.num_edges = 3;
    if (!ok(static_cast<cudaError_t>(kernels::launch_band_select_for_probe(p, s)), "band-select launch")) break;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t cg = nullptr;
    const cudaGraphNode_t* deps = nullptr;
    const cudaGraphEdgeData* edges = nullptr;
    std::size_t ndeps = 0;
    if (!ok(cudaStreamGetCaptureInfo(s, &status, nullptr, &cg, &deps, &edges, &ndeps), "cudaStreamGetCaptureInfo"))
      break;
    if (status != cudaStreamCaptureStatusActive || ndeps != 1) {
      failed = "probe: the band-select kernel is not the capture's only dependency";
      break;
    }
    const cudaGraphNode_t select_node = deps[0];
    cudaGraphConditionalHandle h = 0;
    if (!ok(cudaGraphConditionalHandleCreate(&h, cg, 0, 0), "cudaGraphConditionalHandleCreate")) break;
    cudaGraphNodeParams np{};
    np.type = cudaGraphNodeTypeConditional;
    np.conditional.handle = h;
    np.conditional.type = cudaGraphCondTypeSwitch;
    np.conditional.size = 3;
    cudaGraphNode_t sw = nullptr;
    if (!ok(cudaGraphAddNode(&sw, cg, deps, edges, ndeps, &np), "cudaGraphAddNode(SWITCH) in a capture") ||
        !ok(cudaStreamUpdateCaptureDependencies(s, &sw, nullptr, 1, cudaStreamSetCaptureDependencies),
            "cudaStreamUpdateCaptureDependencies"))
      break;
    for (int b = 0; b < 2 && failed.empty(); ++b) {
      if (!ok(cudaStreamBeginCaptureToGraph(s2, np.conditional.phGraph_out[b], nullptr, nullptr, 0,
                                            cudaStreamCaptureModeThreadLocal),
              "cudaStreamBeginCaptureToGraph"))
        break;
      capturing2 = true;
      if (!ok(static_cast<cudaError_t>(kernels::launch_probe_mark(d + 4, 100 + b, s2)), "kernel launch in a body"))
        break;
      cudaGraph_t body = nullptr;
      capturing2 = false;
      ok(cudaStreamEndCapture(s2, &body), "cudaStreamEndCapture(body)");
    }
    if (!failed.empty()) break;
    cudaGraphNode_t child = nullptr;
    if (!ok(cudaGraphAddChildGraphNode(&child, np.conditional.phGraph_out[2], nullptr, 0,
                                       np.conditional.phGraph_out[0]),
            "cudaGraphAddChildGraphNode in a body"))
      break;
    capturing = false;
    if (!ok(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture")) break;
    cudaKernelNodeParams kp{};
    if (!ok(cudaGraphKernelNodeGetParams(select_node, &kp), "cudaGraphKernelNodeGetParams")) break;
    p.num_handles = 1;
    p.handles[0] = h;
    void* args[] = {&p};
    kp.kernelParams = args;
    kp.extra = nullptr;
    if (!ok(cudaGraphKernelNodeSetParams(select_node, &kp), "cudaGraphKernelNodeSetParams") ||
        !ok(cudaGraphInstantiate(&e, g, 0), "cudaGraphInstantiate"))
      break;
    // Length 12 is band 1 (its captured branch writes 101); 20 is band 2 (the clone of branch 0: 100).
    const int cases[2][2] = {{12, 101}, {20, 100}};
    for (const auto& c : cases) {
      int mark = -1;
      // All on s: a non-blocking stream is not ordered with the legacy stream's copies.
      if (!ok(cudaMemcpyAsync(d, &c[0], sizeof(int), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync") ||
          !ok(cudaMemsetAsync(d + 4, 0xff, sizeof(int), s), "cudaMemsetAsync") ||
          !ok(cudaGraphLaunch(e, s), "cudaGraphLaunch") ||
          !ok(cudaMemcpyAsync(&mark, d + 4, sizeof(int), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync") ||
          !ok(cudaStreamSynchronize(s), "cudaStreamSynchronize"))
        break;
      if (mark != c[1]) {
        failed = "probe: a length of band " + std::to_string(c[1] == 101 ? 1 : 2) + " ran the wrong SWITCH branch (wrote " +
                 std::to_string(mark) + ", expected " + std::to_string(c[1]) + ")";
        break;
      }
    }
  } while (false);
  if (capturing2) {
    cudaGraph_t body = nullptr;
    (void)cudaStreamEndCapture(s2, &body);
  }
  if (capturing) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(s, &partial);
    if (partial) (void)cudaGraphDestroy(partial);
  }
  if (e) (void)cudaGraphExecDestroy(e);
  if (g) (void)cudaGraphDestroy(g);
  if (d) (void)cudaFree(d);
  if (s2) (void)cudaStreamDestroy(s2);
  if (s) (void)cudaStreamDestroy(s);
  (void)cudaGetLastError();
  return failed;
}

}  // namespace

}  // namespace decodegraph::detail
