// Device-side checks for the GPU tests (CUDA builds only; tests/gpu/device_compare.cu, Thrust):
// compare two device buffers where they are, instead of copying whole outputs to the host first.
//   device_diff            max |a - b| with its index, non-finite and out-of-tolerance counts
//   device_first_mismatch  the first differing byte of two buffers (bitwise equality)
// and the GoogleTest assertions built on them. The inputs must be ready: the caller synchronises
// the streams that wrote them (each call below returns its result to the host, so it synchronises
// `stream` itself).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "decodegraph/types.hpp"

#if !defined(__CUDACC__)  // the assertions are for the test sources; device_compare.cu needs no gtest
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>
#endif

namespace dgtest {

/// a against b over n elements, each buffer in its own dtype (fp16, bf16 or fp32), read as float and
/// compared in double. A pair is out of tolerance when |a - b| > atol + rtol * |b| (b is the
/// reference); a pair where either value is NaN or Inf is counted as non-finite instead.
struct DeviceDiff {
  std::size_t n = 0;
  double max_abs = 0;           // over finite pairs
  std::size_t max_index = 0;    // lowest index holding max_abs
  float a_at_max = 0, b_at_max = 0;
  std::size_t non_finite = 0;
  std::size_t first_non_finite = 0;  // valid when non_finite > 0
  std::size_t over_tol = 0;
  std::size_t first_over_tol = 0;    // valid when over_tol > 0
};
DeviceDiff device_diff(decodegraph::DType a_dtype, const void* a, decodegraph::DType b_dtype, const void* b,
                       std::size_t n, double atol, double rtol, cudaStream_t stream = nullptr);

/// Offset of the first byte where the device buffers a and b differ; `bytes` when they are equal.
std::size_t device_first_mismatch(const void* a, const void* b, std::size_t bytes, cudaStream_t stream = nullptr);

#if !defined(__CUDACC__)
/// a and b (device) hold the same bytes; otherwise names the first differing byte.
inline ::testing::AssertionResult bitwise_equal_on_device(const void* a, const void* b, std::size_t bytes,
                                                          cudaStream_t stream = nullptr) {
  const std::size_t at = device_first_mismatch(a, b, bytes, stream);
  if (at == bytes) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "buffers of " << bytes << " bytes differ, first at byte " << at;
}

/// out [num_seqs, num_heads, head_size] of `dtype` (device) against the float64 reference ref (host):
/// |out - ref| <= atol + rtol * |ref|. The reference goes to the device as fp32; its rounding
/// (2^-24 relative) is far below every dtype's rtol. The result names the max error next to the
/// tolerance, the counts out of tolerance and non-finite, and where the worst element is.
inline ::testing::AssertionResult check_close_on_device(decodegraph::DType dtype, const void* out,
                                                        const std::vector<double>& ref, int num_seqs,
                                                        int num_heads, int head_size, double atol,
                                                        double rtol) {
  const std::size_t n = static_cast<std::size_t>(num_seqs) * num_heads * head_size;
  if (ref.size() < n) return ::testing::AssertionFailure() << "reference holds " << ref.size() << " of " << n << " elements";
  const std::vector<float> ref32(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(n));
  void* dref = nullptr;
  if (cudaMalloc(&dref, n * sizeof(float) + 16) != cudaSuccess)
    return ::testing::AssertionFailure() << "cudaMalloc of the reference failed";
  const cudaError_t copied = cudaMemcpy(dref, ref32.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  const DeviceDiff d = copied == cudaSuccess
                           ? device_diff(dtype, out, decodegraph::DType::kFloat32, dref, n, atol, rtol)
                           : DeviceDiff{};
  cudaFree(dref);
  if (copied != cudaSuccess) return ::testing::AssertionFailure() << "cudaMemcpy of the reference failed";
  auto where = [&](std::size_t i) {
    std::ostringstream w;
    w << "(seq " << i / (static_cast<std::size_t>(num_heads) * head_size) << ", head "
      << (i / head_size) % num_heads << ", d " << i % head_size << ")";
    return w.str();
  };
  std::ostringstream msg;
  msg << "max |err| " << d.max_abs << " at " << where(d.max_index) << " (out " << d.a_at_max << ", ref "
      << d.b_at_max << ", allowed " << atol + rtol * (d.b_at_max < 0 ? -d.b_at_max : d.b_at_max)
      << "; atol " << atol << ", rtol " << rtol << "); " << d.over_tol << " of " << n
      << " elements out of tolerance, " << d.non_finite << " non-finite";
  if (d.over_tol > 0) msg << "; first out of tolerance at " << where(d.first_over_tol);
  if (d.non_finite > 0) msg << "; first non-finite at " << where(d.first_non_finite);
  if (d.over_tol == 0 && d.non_finite == 0) return ::testing::AssertionSuccess() << msg.str();
  return ::testing::AssertionFailure() << msg.str();
}
#endif  // !__CUDACC__

}  // namespace dgtest
