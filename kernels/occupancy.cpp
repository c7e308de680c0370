// Host side of kernels/occupancy.hpp: the occupancy formula and the resource table of the pass-1
// kernel. The CUDA query lives in launch.cu (it needs the kernel symbols).
#include "kernels/occupancy.hpp"

#include <algorithm>

#include "decodegraph/error.hpp"
#include "kernels/decode_policy.hpp"

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

// Registers per thread of each pass-1 instantiation as nvcc 13.0 compiles it for sm_90 (ptxas -v,
// read off bench/results/static/after-fixed.json; the kernel is capped at kPass1MaxRegisters = 80
// with __maxnreg__, none spills). Re-read them whenever the kernel changes: scripts/kernel_report.sh
// prints them, and Occupancy.ModelMatchesTheStaticReport fails until these tables match the report
// it reads. Shared memory needs no table: it is all static (pass1_smem).
struct RegRow {
  int d;
  int fp16_vllm, fp16_nhd, bf16_vllm, bf16_nhd, fp32_vllm, fp32_nhd;
};
constexpr RegRow kPass1Registers[] = {
    {64, 80, 79, 80, 72, 79, 80},   {80, 80, 66, 80, 66, 80, 79},   {96, 80, 66, 80, 66, 80, 79},
    {112, 80, 68, 80, 68, 80, 79},  {128, 80, 80, 80, 72, 77, 79},  {192, 80, 66, 80, 66, 80, 80},
    {256, 80, 80, 80, 72, 80, 80},
};

// The tensor-core kernel (fp16 / bf16, groups >= 4; tensor_core_math.cuh), likewise from ptxas -v.
// Its caps per (head size, layout) are tc_pass1_max_registers (decode_policy.hpp). fp16 and bf16
// compile to the same counts.
struct TcRegRow {
  int d;
  int vllm, nhd;
};
constexpr TcRegRow kPass1TcRegisters[] = {
    {64, 93, 80}, {80, 90, 79}, {96, 91, 80}, {112, 96, 80}, {128, 95, 80}, {192, 96, 87}, {256, 121, 116},
};

// The tensor-core kernel of fp8 caches (every group; inst/decode_fp8*.cu), likewise: E4M3 and E5M2
// compile to the same counts. Caps: tc_pass1_max_registers(d, layout, true).
constexpr TcRegRow kPass1Fp8Registers[] = {
    {64, 86, 83}, {80, 94, 94}, {96, 96, 90}, {112, 102, 90}, {128, 94, 90}, {192, 128, 126}, {256, 157, 140},
};

// Static shared memory of the pass-1 kernel a spec selects: the policy's array and the side tables
// (pass1_side_smem). elem_bytes: the cache's element size.
int pass1_smem(int elem_bytes, bool tensor_cores, int d) {
  const int bytes = with_head_size(d, [&](auto D) {
    constexpr int kD = decltype(D)::value;
    auto total = [](auto policy, bool cuda_core) {
      using P = decltype(policy);
      return P::kSmemBytes + pass1_side_smem(P::kMaxSegments, cuda_core);
    };
    if (tensor_cores) return elem_bytes == 1 ? total(TcPass1Policy<1, kD>{}, false) : total(TcPass1Policy<2, kD>{}, false);
    return elem_bytes == 4 ? total(Pass1Policy<4, kD>{}, true) : total(Pass1Policy<2, kD>{}, true);
  }, -1);
  if (bytes < 0) throw_invalid("head_size", d, "64, 80, 96, 112, 128, 192, 256");
  return bytes;
}

}  // namespace

// As launch_paged_decode splits the group (decode_policy.hpp), so the planner counts grid y as the launch does.
int pass1_head_chunks(const AttentionSpec& spec, int q_len) {
  validate_spec(spec);
  return pass1_head_chunks_for(pass1_rows(spec.group_size(), q_len));
}

// The pass-1 kernel (kernels/paged_decode.cuh, policy in decode_policy.hpp) of the math the
// launcher selects (pass1_uses_tensor_cores): CUDA-core, one warp per query head of a block's head
// chunk and at least four warps; tensor-core, four warps. Static shared memory only.
KernelResources pass1_resources(const AttentionSpec& spec, int q_len) {
  validate_spec(spec);
  const bool nhd = spec.layout == KVLayout::kNHD;
  const int elem = static_cast<int>(spec.kv_elem_size());
  const int rows = pass1_rows(spec.group_size(), q_len);  // what launch_paged_decode selects by
  KernelResources r;
  r.threads = pass1_threads_for(elem, rows);
  if (pass1_uses_tensor_cores(elem, rows)) {
    const TcRegRow* table = elem == 1 ? std::begin(kPass1Fp8Registers) : std::begin(kPass1TcRegisters);
    const TcRegRow* row = std::find_if(table, table + std::size(kPass1TcRegisters),
                                       [&](const TcRegRow& t) { return t.d == spec.head_size; });
    r.registers = nhd ? row->nhd : row->vllm;
    r.smem_bytes = pass1_smem(elem, true, spec.head_size);
    return r;
  }
  const RegRow* row = std::find_if(std::begin(kPass1Registers), std::end(kPass1Registers),
                                   [&](const RegRow& r) { return r.d == spec.head_size; });
  switch (spec.dtype) {
    case DType::kFloat16: r.registers = nhd ? row->fp16_nhd : row->fp16_vllm; break;
    case DType::kBFloat16: r.registers = nhd ? row->bf16_nhd : row->bf16_vllm; break;
    case DType::kFloat32: r.registers = nhd ? row->fp32_nhd : row->fp32_vllm; break;
  }
  r.smem_bytes = pass1_smem(elem, false, spec.head_size);
  return r;
}

}  // namespace decodegraph::kernels
