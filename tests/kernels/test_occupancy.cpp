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
