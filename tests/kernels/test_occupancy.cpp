// kernels/occupancy.hpp: the occupancy formula against values worked out by hand for sm_90
// (65,536 registers, 228 KiB shared memory, 2,048 threads, 32 blocks per SM; 1 KiB reserved per block).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/types.hpp"
#include "executor/cost_model.hpp"
#include "kernels/decode_policy.hpp"
#include "kernels/occupancy.hpp"

namespace dg = decodegraph;
using dg::kernels::blocks_per_sm;
using dg::kernels::KernelResources;

TEST(Occupancy, RegisterLimited) {
  // 81 regs -> 81*32 = 2592 per warp -> 2816 (unit 256); 65536 / 2816 = 23 warps; 4 warps per block -> 5.
  EXPECT_EQ(blocks_per_sm({128, 81, 0}), 5);
  // 64 regs: 2048 per warp, 32 warps, 4 per block -> 8.
  EXPECT_EQ(blocks_per_sm({128, 64, 0}), 8);
}

TEST(Occupancy, SharedMemoryLimited) {
  // 41,024 + 1,024 = 42,048 -> 42,112 (unit 128); 233,472 / 42,112 = 5.
  EXPECT_EQ(blocks_per_sm({128, 32, 41024}), 5);
  // 100 KiB + 1 KiB = 103,424: 2 fit.
  EXPECT_EQ(blocks_per_sm({128, 32, 100 * 1024}), 2);
  // A block larger than the SM's shared memory does not fit at all.
  EXPECT_EQ(blocks_per_sm({128, 32, 240 * 1024}), 0);
}

TEST(Occupancy, ThreadAndBlockLimited) {
  EXPECT_EQ(blocks_per_sm({512, 32, 0}), 4);   // 2048 / 512
  EXPECT_EQ(blocks_per_sm({32, 16, 0}), 32);   // the 32-block cap, not 64 by threads
  EXPECT_EQ(blocks_per_sm({1024, 64, 0}), 1);  // 32 warps x 2048 registers = the whole file
}

TEST(Occupancy, RejectsImpossibleResources) {
  EXPECT_THROW(blocks_per_sm({0, 32, 0}), dg::Error);
  EXPECT_THROW(blocks_per_sm({128, 300, 0}), dg::Error);
  EXPECT_THROW(blocks_per_sm({128, 32, -1}), dg::Error);
}

TEST(Occupancy, Pass1ModelCoversEverySpec) {
  for (dg::DType dt : {dg::DType::kFloat16, dg::DType::kBFloat16, dg::DType::kFloat32})
    for (int d : dg::kSupportedHeadSizes)
      for (int g : {1, 4, 8, 16, 32}) {
        dg::AttentionSpec s;
        s.num_kv_heads = 2;
        s.num_q_heads = 2 * g;
        s.head_size = d;
        s.dtype = dt;
        const KernelResources r = dg::kernels::pass1_resources(s);
        EXPECT_GE(blocks_per_sm(r), 1) << "dtype " << dg::to_string(dt) << " D " << d << " group " << g;
      }
}

TEST(Occupancy, Pass1ModelWorkedExamples) {
  // fp32, head 128, GQA 4 (32q/8kv), vLLM layout: the CUDA-core math, four warps (one per query
  // head), 77 registers, 4 x 8 KB stages (8-token tiles) + a 16-byte block-id table = 32,784 bytes,
  // plus the side tables: edge marks 160, edge state 24, the clamped-id record 4 (one segment a
  // tile), query positions 128 = 33,100 bytes of shared memory. Registers: 77 x 32 = 2,464 per
  // warp, allocated in 256s: 2,560 -> 25 warps -> 6 blocks; shared memory: 33,100 + 1,024 -> 34,176
  // (unit 128) -> 233,472 / 34,176 = 6 blocks; threads: 16 blocks. So 6.
  dg::AttentionSpec s;
  s.num_q_heads = 32;
  s.num_kv_heads = 8;
  s.head_size = 128;
  s.dtype = dg::DType::kFloat32;
  KernelResources r = dg::kernels::pass1_resources(s);
  EXPECT_EQ(r.threads, 128);
  EXPECT_EQ(r.registers, 77);
  EXPECT_EQ(r.smem_bytes, 33100);
  EXPECT_EQ(blocks_per_sm(r), 6);
  // GQA 8 (llama-70B-like 64q/8kv): eight warps -> 25 / 8 = 3 blocks by registers.
  s.num_q_heads = 64;
  EXPECT_EQ(dg::kernels::pass1_resources(s).threads, 256);
  EXPECT_EQ(blocks_per_sm(dg::kernels::pass1_resources(s)), 3);
  // bf16 MHA (group 1) stays on the CUDA-core math with four warps (the loader's 128 threads);
  // 16-token tiles, a 32-byte block-id table (32,800 bytes), a record of two segments: 33,120.
  s.dtype = dg::DType::kBFloat16;
  s.num_q_heads = 8;
  EXPECT_EQ(dg::kernels::pass1_resources(s).threads, 128);
  EXPECT_EQ(dg::kernels::pass1_resources(s).smem_bytes, 33120);
  // bf16 GQA 4 runs on tensor cores (decode_policy.hpp, pass1_uses_tensor_cores): four warps, the
  // same stages plus the exchange (2,048 bytes of partial scores, 1,024 of hi / lo weights, 64 of
  // rescale factors) = 35,936 bytes, and the side tables without query positions (192) = 36,128;
  // 95 registers (vLLM layout) -> 3,040 per warp, allocated in 256s: 3,072 -> 21 warps -> 5 blocks;
  // shared memory 37,152 -> 37,248 -> 6. So 5. NHD: 80 registers ->
  // 2,560 per warp -> 25 warps -> 6 blocks.
  s.num_q_heads = 32;
  r = dg::kernels::pass1_resources(s);
  EXPECT_EQ(r.threads, 128);
  EXPECT_EQ(r.registers, 95);
  EXPECT_EQ(r.smem_bytes, 36128);
  EXPECT_EQ(blocks_per_sm(r), 5);
  s.layout = dg::KVLayout::kNHD;
  EXPECT_EQ(blocks_per_sm(dg::kernels::pass1_resources(s)), 6);
  s.layout = dg::KVLayout::kVLLM;
  // On tensor cores the block stays four warps whatever the group: 8, and 24 (two chunks of 12).
  s.num_q_heads = 64;
  EXPECT_EQ(dg::kernels::pass1_resources(s).threads, 128);
  s.num_q_heads = 24;
  s.num_kv_heads = 1;
  EXPECT_EQ(dg::kernels::pass1_resources(s).threads, 128);
  EXPECT_EQ(dg::kernels::pass1_head_chunks(s), 2);
  // fp32 keeps one warp per head: a group of 24 splits into two chunks of 12 heads = 12 warps.
  s.dtype = dg::DType::kFloat32;
  EXPECT_EQ(dg::kernels::pass1_resources(s).threads, 384);
}

// The model against what ptxas produced: every pass-1 row of the committed static report
// (scripts/kernel_report.sh: each instantiation at GQA 1, 4, 8 and q_len 1, 4), where the launcher
// selects that row's math, must have the model's registers, shared memory and blocks per SM. A
// kernel change makes a new report; this fails until the register tables (occupancy.cpp) follow.
namespace {

struct ReportRow {
  std::string kernel;
  int group = 0, q_len = 0, registers = 0, smem = 0, blocks = 0;
};

int int_field(const std::string& obj, const std::string& key) {
  const std::size_t at = obj.find("\"" + key + "\": ");
  if (at == std::string::npos) return -1;
  return std::atoi(obj.c_str() + at + key.size() + 4);
}

std::vector<ReportRow> rows_of(const std::string& path, const std::string& kernel) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::vector<ReportRow> rows;
  const std::string key = "\"kernel\": \"" + kernel + "<";
  for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    const std::size_t end = text.find('}', at);
    const std::string obj = text.substr(at, end - at);
    ReportRow r;
    r.kernel = obj.substr(key.size() - 1, obj.find('"', key.size()) - key.size() + 1);
    r.group = int_field(obj, "group");
    r.q_len = int_field(obj, "q_len");
    r.registers = int_field(obj, "registers");
    r.smem = int_field(obj, "smem_static");
    r.blocks = int_field(obj, "blocks_per_sm");
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

TEST(Occupancy, ModelMatchesTheStaticReport) {
  const std::vector<ReportRow> rows = rows_of(DG_STATIC_REPORT, "PagedDecodeKernel");
  ASSERT_GE(rows.size(), 300u) << DG_STATIC_REPORT;
  int checked = 0;
  for (const ReportRow& r : rows) {
    // "<bf16, fp8e4m3, 128, (KVLayout)1, TensorCoreMath>": q dtype, cache, head, layout, math.
    std::vector<std::string> f;
    std::stringstream parts(r.kernel.substr(1, r.kernel.size() - 2));
    for (std::string p; std::getline(parts, p, ',');) f.push_back(p.substr(p.find_first_not_of(' ')));
    ASSERT_EQ(f.size(), 5u) << r.kernel;
    dg::AttentionSpec s;
    s.dtype = dg::parse_dtype(f[0]);
    s.kv_dtype = f[1] == "fp8e4m3" ? dg::KVCacheDType::kFp8E4M3
                 : f[1] == "fp8e5m2" ? dg::KVCacheDType::kFp8E5M2 : dg::KVCacheDType::kAuto;
    s.head_size = std::atoi(f[2].c_str());
    s.layout = f[3] == "(KVLayout)1" ? dg::KVLayout::kNHD : dg::KVLayout::kVLLM;
    s.num_kv_heads = 2;
    s.num_q_heads = 2 * r.group;
    const int elem = static_cast<int>(s.kv_elem_size());
    const bool tc = dg::kernels::pass1_uses_tensor_cores(elem, dg::kernels::pass1_rows(r.group, r.q_len));
    if (tc != (f[4] == "TensorCoreMath")) continue;  // the report compiles both maths; launches pick one
    SCOPED_TRACE(r.kernel + " GQA " + std::to_string(r.group) + " q_len " + std::to_string(r.q_len));
    const KernelResources m = dg::kernels::pass1_resources(s, r.q_len);
    EXPECT_EQ(m.registers, r.registers);
    EXPECT_EQ(m.smem_bytes, r.smem);
    EXPECT_EQ(blocks_per_sm(m), r.blocks);
    ++checked;
  }
  EXPECT_GE(checked, 200);
  // The merge's, for the cost model's residency of it (executor/cost_model.cpp).
  const std::vector<ReportRow> merge = rows_of(DG_STATIC_REPORT, "MergePartitionsKernel");
  ASSERT_EQ(merge.size(), 3u);
  for (const ReportRow& r : merge) {
    EXPECT_EQ(r.registers, dg::detail::CostConstants{}.merge_registers) << r.kernel;
    EXPECT_EQ(r.smem, dg::detail::CostConstants{}.merge_smem_bytes) << r.kernel;
  }
}

// The pass-1 kernel finds a block's KV head as grid y / head_chunks with small_div (a multiply, not
// a ~20-instruction division); it must be exact wherever grid y and the divisor can be (< 2^16).
TEST(Pass1Policy, SmallDivIsExactBelow2To16) {
  for (int d : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 63, 255, 4097, 65535}) {
    const uint64_t m = dg::kernels::small_div_magic(d);
    int wrong = 0;
    for (int y = 0; y < 65536; ++y) wrong += dg::kernels::small_div(y, m) != y / d;
    EXPECT_EQ(wrong, 0) << "divisor " << d;
  }
}
