// A host Problem (tests/kernels/problem.hpp) mirrored in simulator "device" memory, for the tests
// that call the launchers under the simulator (sim_sweep_test.cpp, sim_numerics_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "../kernels/problem.hpp"
#include "cuda_runtime.h"
#include "decodegraph/attention.hpp"

namespace dgsim {

inline void sim_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// One simulator allocation, optionally filled from host memory.
struct Dev {
  void* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t bytes, const void* src = nullptr) : n(bytes) {
    sim_ok(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)), "cudaMalloc");
    if (src != nullptr) sim_ok(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void fetch(void* dst) const { sim_ok(cudaMemcpy(dst, p, n, cudaMemcpyDeviceToHost), "fetch"); }
};

/// q, out, caches, tables, lengths and ALiBi slopes of `p` on the device; `args` points at them
/// (no host copies of the lengths or tables: padded rows would fail their validation).
struct DeviceProblem {
  Dev q, out, k, v, tables, lens;
  std::unique_ptr<Dev> slopes, k_scale, v_scale, sinks;
  decodegraph::DecodeArgs args;
  explicit DeviceProblem(const dgtest::Problem& p)
      : q(p.q.bytes, p.q.data()), out(p.poisoned.bytes), k(p.k.bytes, p.k.data()), v(p.v.bytes, p.v.data()),
        tables(p.tables.size() * sizeof(int32_t), p.tables.data()), lens(p.lens.size() * sizeof(int32_t), p.lens.data()),
        args(p.args) {
    args.q = q.p;
    args.out = out.p;
    args.k_cache = k.p;
    args.v_cache = v.p;
    args.block_tables = static_cast<const int32_t*>(tables.p);
    args.seq_lens = static_cast<const int32_t*>(lens.p);
    args.host_seq_lens = nullptr;
    args.host_block_tables = nullptr;
    if (!p.slopes.empty()) {
      slopes = std::make_unique<Dev>(p.slopes.size() * sizeof(float), p.slopes.data());
      args.alibi_slopes = static_cast<const float*>(slopes->p);
    }
    if (p.args.spec.fp8_kv()) {  // fp8 caches: the scales live in device memory
      k_scale = std::make_unique<Dev>(p.k_scales.size() * sizeof(float), p.k_scales.data());
      v_scale = std::make_unique<Dev>(p.v_scales.size() * sizeof(float), p.v_scales.data());
      args.k_scale = static_cast<const float*>(k_scale->p);
      args.v_scale = static_cast<const float*>(v_scale->p);
    }
    if (!p.sinks.empty()) {
      sinks = std::make_unique<Dev>(p.sinks.size() * sizeof(float), p.sinks.data());
      args.sinks = static_cast<const float*>(sinks->p);
    }
  }
  /// Resets the device output to the problem's NaN pattern.
  void poison(const dgtest::Problem& p) {
    sim_ok(cudaMemcpy(out.p, p.poisoned.data(), p.poisoned.bytes, cudaMemcpyHostToDevice), "poison");
  }
};

}  // namespace dgsim
