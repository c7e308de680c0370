// kernels/probe.hpp: one thread per element, the same device functions the pass-1 kernels call.
#include <cuda_runtime.h>

#include "decodegraph/error.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/paged_decode.cuh"
#include "kernels/probe.hpp"

namespace decodegraph::kernels {
namespace {

struct ProbeParams {
  ProbeOp op;
  const float* in;
  float* out;
  int n;
  float cap2, k2;
};

__global__ void ProbeDeviceMathKernel(const __grid_constant__ ProbeParams p) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= p.n) return;
  const float x = p.in[i];
  switch (p.op) {
    case ProbeOp::kEx2: p.out[i] = dev::ex2(x); break;
    case ProbeOp::kRcp: p.out[i] = dev::rcp(x); break;
    case ProbeOp::kSoftcap2: p.out[i] = softcap2_dev(x, p.cap2, p.k2); break;
  }
}

}  // namespace

void probe_device_math(ProbeOp op, const float* in, float* out, int n, float cap2, Stream stream) {
  require(n >= 0, "n", n, ">= 0");
  if (op == ProbeOp::kSoftcap2) require(cap2 > 0.0f, "cap2", cap2, "> 0 (a base-2 soft-cap)");
  if (n == 0) return;
  (void)DG_CUDA_TAKE_PENDING("probe_device_math");
  constexpr int kThreads = 256;
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  const ProbeParams p{op, in, out, n, cap2, math::softcap2_k(cap2)};
  ProbeDeviceMathKernel<<<blocks, kThreads, 0, stream>>>(p);
  DG_CUDA_CHECK_LAUNCH("ProbeDeviceMathKernel");
}

}  // namespace decodegraph::kernels
