// kernels/occupancy.hpp: the occupancy formula against values worked out by hand for sm_90
// (65,536 registers, 228 KiB shared memory, 2,048 threads, 32 blocks per SM; 1 KiB reserved per block).
#include <gtest/gtest.h>

#include "decodegraph/error.hpp"
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
  // head), 79 registers, 4 x 8 KB stages (8-token tiles) + a 16-byte block-id table = 32,784 bytes
  // of shared memory. Registers: 79 x 32 = 2,528 per warp, allocated in 256s: 2,560 -> 25 warps ->
  // 6 blocks; shared memory:
  // 32,784 + 1,024 -> 33,920 (unit 128) -> 233,472 / 33,920 = 6 blocks; threads: 16 blocks. So 6.
  dg::AttentionSpec s;
  s.num_q_heads = 32;
  s.num_kv_heads = 8;
  s.head_size = 128;
  s.dtype = dg::DType::kFloat32;
  KernelResources r = dg::kernels::pass1_resources(s);
  EXPECT_EQ(r.threads, 128);
  EXPECT_EQ(r.registers, 79);
  EXPECT_EQ(r.smem_bytes, 32784);
  EXPECT_EQ(blocks_per_sm(r), 6);
  // GQA 8 (llama-70B-like 64q/8kv): eight warps -> 25 / 8 = 3 blocks by registers.
  s.num_q_heads = 64;
  EXPECT_EQ(dg::kernels::pass1_resources(s).threads, 256);
  EXPECT_EQ(blocks_per_sm(dg::kernels::pass1_resources(s)), 3);
  // bf16 MHA (group 1) stays on the CUDA-core math with four warps (the loader's 128 threads);
  // 16-token tiles, a 32-byte block-id table.
  s.dtype = dg::DType::kBFloat16;
  s.num_q_heads = 8;
  EXPECT_EQ(dg::kernels::pass1_resources(s).threads, 128);
  EXPECT_EQ(dg::kernels::pass1_resources(s).smem_bytes, 32800);
  // bf16 GQA 4 runs on tensor cores (decode_policy.hpp, pass1_uses_tensor_cores): four warps, the
  // same stages plus the exchange (2,048 bytes of partial scores, 1,024 of hi / lo weights, 64 of
  // rescale factors) = 35,936 bytes; 95 registers (vLLM layout) -> 3,040 per warp, allocated in
  // 256s: 3,072 -> 21 warps -> 5 blocks; shared memory 36,960 -> 6. So 5. NHD: 80 registers ->
  // 2,560 per warp -> 25 warps -> 6 blocks.
  s.num_q_heads = 32;
  r = dg::kernels::pass1_resources(s);
  EXPECT_EQ(r.threads, 128);
  EXPECT_EQ(r.registers, 95);
  EXPECT_EQ(r.smem_bytes, 35936);
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
