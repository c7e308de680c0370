// Device probes of the approximate instructions the kernels build on: what the hardware's ex2.approx,
// rcp.approx and the soft-cap made of them return, element by element, so a test can hold them
// against a float64 reference (GpuKernels.SoftcapDeviceMathAgainstTanh; bench/gpu_check.sh prints
// what it measured). The simulator runs the same kernel on its worst-case models. Not API.
#pragma once

#include "decodegraph/types.hpp"

namespace decodegraph::kernels {

enum class ProbeOp {
  kEx2,       ///< dev::ex2(x): ex2.approx.ftz.f32
  kRcp,       ///< dev::rcp(x): rcp.approx.ftz.f32
  kSoftcap2,  ///< softcap2_dev(x, cap2, math::softcap2_k(cap2)): the pass-1 kernels' soft-cap
};

/// out[i] = op(in[i]) for i < n, on the device (in, out: device pointers; cap2 for kSoftcap2 only,
/// > 0). Throws InvalidArgument for n < 0 or a cap2 that is not > 0, CudaError for a failed launch.
void probe_device_math(ProbeOp op, const float* in, float* out, int n, float cap2, Stream stream);

}  // namespace decodegraph::kernels
