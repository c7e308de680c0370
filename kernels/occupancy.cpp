// Host side of kernels/occupancy.hpp: the occupancy formula and the resource table of the pass-1
// kernel. The CUDA query lives in launch.cu (it needs the kernel symbols).
#include "kernels/occupancy.hpp"

#include <algorithm>

#include "decodegraph/error.hpp"

namespace decodegraph::kernels {

int blocks_per_sm(const KernelResources& r, const SmLimits& lim) {
  require(r.threads >= 1 && r.threads <= 1024, "threads", r.threads, "1..1024");
  require(r.registers >= 1 && r.registers <= 255, "registers", r.registers, "1..255");
  require(r.smem_bytes >= 0, "smem_bytes", r.smem_bytes, ">= 0");
  const int warps = (r.threads + 31) / 32;
  const int by_threads = lim.max_threads / (warps * 32);
  // Registers: per warp, rounded up to the allocation unit.
  const int regs_per_warp = (r.registers * 32 + lim.reg_alloc_unit - 1) / lim.reg_alloc_unit * lim.reg_alloc_unit;
  const int by_regs = (lim.registers / regs_per_warp) / warps;
  const int smem = (r.smem_bytes + lim.smem_reserved_per_block + lim.smem_alloc_unit - 1) /
                   lim.smem_alloc_unit * lim.smem_alloc_unit;
  const int by_smem = lim.smem_bytes / smem;
  return std::max(0, std::min({lim.max_blocks, by_threads, by_regs, by_smem}));
}

namespace {

int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

}  // namespace

// As launch_paged_decode splits the group: heads_per_block = next_pow2(min(group, 16)).
int pass1_head_chunks(const AttentionSpec& spec) {
  validate_spec(spec);
  const int group = spec.group_size();
  const int per_block = next_pow2(std::min(group, 16));
  return (group + per_block - 1) / per_block;
}

// Current kernel (kernels/paged_decode.cuh, DecodePolicy): threads = max(128, LANES x GY) with
// LANES = next_pow2(D) / VEC, VEC = max(16 / elem bytes, next_pow2(D) / 32), GY = next_pow2(min(group,
// 16)); registers and static shared memory from ptxas (nvcc 13.0, sm_90, V2 kernel; V1 is equal).
KernelResources pass1_resources(const AttentionSpec& spec) {
  validate_spec(spec);
  struct Row {
    int d, regs2, smem2, regs4, smem4;  // 2-byte dtypes (fp16 / bf16), fp32
  };
  static constexpr Row kTable[] = {
      {64, 81, 24704, 64, 38976},  {80, 82, 28736, 64, 24608},  {96, 82, 32832, 64, 28704},
      {112, 86, 36928, 64, 32800}, {128, 81, 41024, 64, 36896}, {192, 82, 30752, 82, 29728},
      {256, 80, 38944, 80, 37920},
  };
  const int eb = static_cast<int>(dtype_size(spec.dtype));
  const Row* row = std::find_if(std::begin(kTable), std::end(kTable), [&](const Row& r) { return r.d == spec.head_size; });
  const int dpad = next_pow2(spec.head_size);
  const int vec = std::max(16 / eb, dpad / 32);
  const int lanes = dpad / vec;
  const int gy = next_pow2(std::min(spec.group_size(), 16));
  KernelResources r;
  r.threads = std::max(128, lanes * gy);
  r.registers = eb == 4 ? row->regs4 : row->regs2;
  r.smem_bytes = eb == 4 ? row->smem4 : row->smem2;
  return r;
}

}  // namespace decodegraph::kernels
