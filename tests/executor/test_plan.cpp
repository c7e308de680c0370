// Planning: default bands and buckets, the automatic partition size, the per-bucket plans and the
// plan table. Host-only, no step is run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"

namespace {
using namespace decodegraph;
using dgtest::World;

TEST(Plan, DefaultBandEdgesArePowersOfTwoPlusThreshold) {
  EXPECT_EQ(default_band_edges(32768, 8192), (std::vector<int>{512, 1024, 2048, 4096, 8192, 16384, 32768}));
  EXPECT_EQ(default_band_edges(20000, 6000),
            (std::vector<int>{512, 1024, 2048, 4096, 6000, 8192, 16384, 20000}));
  EXPECT_EQ(default_band_edges(300, 8192), (std::vector<int>{300}));
}

TEST(Plan, DefaultBatchBuckets) {
  EXPECT_EQ(default_batch_buckets(1), (std::vector<int>{1}));
  EXPECT_EQ(default_batch_buckets(7), (std::vector<int>{1, 2, 4, 7}));
  EXPECT_EQ(default_batch_buckets(30), (std::vector<int>{1, 2, 4, 8, 16, 24, 30}));
  const std::vector<int> b = default_batch_buckets(300);
  EXPECT_EQ(b.front(), 1);
  EXPECT_EQ(b.back(), 300);
  EXPECT_NE(std::find(b.begin(), b.end(), 256), b.end());
  EXPECT_NE(std::find(b.begin(), b.end(), 272), b.end());
  EXPECT_NE(std::find(b.begin(), b.end(), 288), b.end());
  EXPECT_EQ(std::find(b.begin(), b.end(), 264), b.end());  // steps of 16 beyond 256
}

TEST(Plan, AutoPartitionSizeFillsOneWave) {
  AttentionSpec s;
  s.num_kv_heads = 8;
  s.block_size = 16;
  // batch 1 x 8 heads, 132 SMs: need ceil(132/8) = 17 partitions of 131072 -> P <= 8191 -> 8176.
  const int p = auto_partition_size(s, 1, 131072, 132);
  EXPECT_EQ(p, 8176);
  EXPECT_GE(1 * 8 * num_partitions(131072, p), 132);
  EXPECT_LT(1 * 8 * num_partitions(131072, p + 16), 132);  // the next multiple no longer fills a wave
  // A big batch fills a wave with one partition: P covers the band.
  EXPECT_EQ(auto_partition_size(s, 64, 16384, 132), 16384);
  // Even 256 is less than a wave: stay at 256.
  EXPECT_EQ(auto_partition_size(s, 1, 4000, 132), 256);  // 17 partitions would need P <= 249
  // The 16-SM GPU of the motivating project: batch 1, 8 heads, 100K tokens.
  const int p16 = auto_partition_size(s, 1, 100000, 16);
  EXPECT_EQ(p16 % 16, 0);
  EXPECT_GE(8 * num_partitions(100000, p16), 16);
  EXPECT_THROW(auto_partition_size(s, 0, 100, 132), Error);
}

TEST(Plan, PlansPickV1UpToThresholdAndV2Above) {
  AttentionSpec s;
  s.num_q_heads = 4;
  s.num_kv_heads = 2;
  s.head_size = 64;
  s.dtype = DType::kFloat32;
  World w(s, 1, 4, 16384);
  ExecutorConfig c = w.config(4, 16384);
  c.num_sms = 132;
  Executor ex(c);
  const auto& plans = ex.plans();
  ASSERT_EQ(plans.size(), ex.config().batch_buckets.size() * ex.config().band_edges.size());
  for (const BucketPlan& p : plans) {
    EXPECT_EQ(p.kernel, p.band_hi <= 8192 ? KernelKind::kV1 : KernelKind::kV2) << p.band_hi;
    if (p.kernel == KernelKind::kV2) {
      EXPECT_EQ(p.partition_size, auto_partition_size(s, p.batch, p.band_hi, 132));
      EXPECT_EQ(p.max_partitions, num_partitions(p.band_hi, p.partition_size));
      EXPECT_EQ(p.grid_x, p.max_partitions);
      EXPECT_EQ(p.workspace_bytes, v2_workspace_size(s, p.batch, p.band_hi, p.partition_size));
      EXPECT_GT(p.workspace_bytes, 0u);
    } else {
      EXPECT_EQ(p.workspace_bytes, 0u);
      EXPECT_EQ(p.grid_x, 1);
    }
    EXPECT_EQ(p.grid_z, p.batch);
  }
  const BucketPlan& last = ex.plan_for(static_cast<int>(ex.config().batch_buckets.size()) - 1,
                                       static_cast<int>(ex.config().band_edges.size()) - 1);
  EXPECT_EQ(last.batch, 4);
  EXPECT_EQ(last.band_hi, 16384);
  EXPECT_EQ(ex.memory().workspace, last.workspace_bytes);  // the largest plan sizes the workspace
  EXPECT_THROW(ex.plan_for(99, 0), Error);

  const std::string table = ex.plan_table();
  EXPECT_NE(table.find("kernel"), std::string::npos);
  EXPECT_NE(table.find("(8192,16384]"), std::string::npos);
  EXPECT_NE(table.find("v2"), std::string::npos) << table;
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), static_cast<long>(plans.size()) + 1);
}

TEST(Plan, FixedPartitionSizeIsUsed) {
  AttentionSpec s;
  s.num_q_heads = 4;
  s.num_kv_heads = 2;
  s.head_size = 64;
  s.dtype = DType::kFloat32;
  World w(s, 1, 2, 4096);
  ExecutorConfig c = w.config(2, 4096);
  c.v2_threshold = 1024;
  c.partition_size = 512;
  Executor ex(c);
  for (const BucketPlan& p : ex.plans())
    if (p.band_hi > 1024) EXPECT_EQ(p.partition_size, 512);
}

}  // namespace
