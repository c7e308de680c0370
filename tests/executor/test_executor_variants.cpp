// Sliding windows, attention sinks and soft-caps per layer in the executor (issue 17) on the host
// backend: a mixed run shaped like gpt-oss-20b against the float64 reference, windowed layers
// planned by min(L, W), freed blocks never read (NaN data; invalid ids where every layer has a
// window, under kFull and kCheap alike), and the bad input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"

namespace {
using namespace decodegraph;
using dgtest::rejects;
using dgtest::World;

// gpt-oss-20b's attention (64 q / 8 kv heads of 64, sinks in every layer, a 128-token window on
// every other layer from layer 0 on), two layers of it.
AttentionSpec gpt_oss_spec(int window) {
  AttentionSpec s;
  s.num_q_heads = 64;
  s.num_kv_heads = 8;
  s.head_size = 64;
  s.block_size = 16;
  s.dtype = DType::kBFloat16;
  s.sliding_window = window;
  return s;
}

struct BandCase {
  BandSelect band;
};
class GptOssLayers : public ::testing::TestWithParam<BandCase> {};

// Lengths cross the window (100 -> 101 -> 250) and 8192 (8100 -> 8193 -> 8300); the first two
// steps replay one graph. The windowed layer's cache holds NaN in every block before its window.
TEST_P(GptOssLayers, EveryLayerMatchesTheReferenceWithSinksAndFreedBlocks) {
  World w({gpt_oss_spec(128), gpt_oss_spec(0)}, 3, 9216, 2017);
  w.set_sinks(-2.0f, 6.0f);
  ExecutorConfig c = w.config(3, 9216);
  c.band_select = GetParam().band;
  Executor ex(c);
  ASSERT_EQ(ex.num_layer_groups(), 2);
  // The windowed group reads at most 128 tokens: V1 in every band, 8192's V2 rule included.
  for (const BucketPlan& p : ex.plans(0)) {
    EXPECT_EQ(p.kernel, KernelKind::kV1) << "band " << p.band;
    EXPECT_EQ(p.window, 128);
    EXPECT_LE(p.design_len, 128) << "band " << p.band;
    // The plan table and JSON say why: every band above the window names min(L, W).
    EXPECT_EQ(describe_reason(p).find("window 128: planned for min(L, 128)") != std::string::npos, p.band_hi > 128)
        << describe_reason(p);
  }
  bool v2 = false;
  for (const BucketPlan& p : ex.plans(1)) {
    v2 = v2 || (p.band_lo >= 8192 && p.kernel == KernelKind::kV2);
    EXPECT_EQ(p.window, 0);
    EXPECT_EQ(describe_reason(p).find("window"), std::string::npos) << describe_reason(p);
  }
  EXPECT_TRUE(v2) << "the full layer runs V2 above 8192";
  EXPECT_NE(ex.plan_table().find("window 128"), std::string::npos);

  const std::vector<std::vector<int>> steps = {{100, 8100, 8191}, {101, 8193, 8192}, {250, 8300, 9000}};
  for (const std::vector<int>& lens : steps) {
    w.set_lens(lens);
    w.poison_outside_window(0);
    w.fill_step(ex);
    ex.step(w.inputs());
    for (int l = 0; l < 2; ++l) {
      EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l << " lengths " << lens[0] << ", " << lens[1];
      EXPECT_TRUE(w.check_appended(ex, l)) << "layer " << l;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Issue17, GptOssLayers, ::testing::Values(BandCase{BandSelect::kHost}, BandCase{BandSelect::kDevice}),
                         [](const ::testing::TestParamInfo<BandCase>& i) {
                           return i.param.band == BandSelect::kHost ? std::string("kHost") : std::string("kDevice");
                         });

// Every layer windowed (Gemma-3-like local layers of 64 and 32 tokens, one with a soft-cap): the
// entries before the widest window hold invalid ids, which neither kFull nor kCheap may reject or
// report, and V2 (forced by a low threshold) covers only the window.
TEST(WindowedLayers, InvalidIdsBeforeEveryWindowAreNeverReadUnderFullAndCheap) {
  for (ValidationLevel level : {ValidationLevel::kFull, ValidationLevel::kCheap}) {
    AttentionSpec a = dgtest::small_spec(DType::kFloat32), b = a;
    a.sliding_window = 64;
    b.sliding_window = 32;
    b.logit_softcap = 5.0f;
    World w({a, b, a}, 4, 1024, 7);
    w.set_sinks(-1.0f, 3.0f);
    ExecutorConfig c = w.config(4, 1024);
    c.validation = level;
    c.policy = KernelPolicy::kThreshold;
    c.v2_threshold = 16;  // planned lengths 32 and 64 > 16: V2
    Executor ex(c);
    for (int g = 0; g < 2; ++g)
      for (const BucketPlan& p : ex.plans(g)) {
        if (p.band_hi <= 16) continue;  // the band below the threshold: V1
        EXPECT_EQ(p.kernel, KernelKind::kV2) << "band " << p.band_hi;
        EXPECT_LE(p.max_partitions, (a.sliding_window + 15 + p.partition_size - 1) / p.partition_size)
            << "partitions cover the window, not the band " << p.band_hi;
      }
    for (const std::vector<int>& lens : {std::vector<int>{1, 40, 300, 1000}, std::vector<int>{2, 41, 301, 1001}}) {
      w.set_lens(lens);
      for (int l = 0; l < 3; ++l) w.poison_outside_window(l);
      w.free_entries_outside_windows();
      w.fill_step(ex);
      EXPECT_NO_THROW(ex.step(w.inputs()));
      EXPECT_NO_THROW(ex.check_errors()) << "no bad block id report for entries outside every window";
      for (int l = 0; l < 3; ++l) {
        EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l;
        EXPECT_TRUE(w.check_appended(ex, l)) << "layer " << l;
      }
    }
  }
}

// kFull still rejects an invalid id the window reads (its first, partly masked block).
TEST(WindowedLayers, FullValidationRejectsAnInvalidIdInsideTheWindow) {
  AttentionSpec a = dgtest::small_spec(DType::kFloat32);
  a.sliding_window = 40;
  World w(a, 1, 2, 512, 3);
  Executor ex(w.config(2, 512));
  w.set_lens({100, 20});  // window 60..99: blocks 3..6
  w.fill_step(ex);
  w.tables[2] = -1;  // before the window: fine
  EXPECT_NO_THROW(ex.step(w.inputs()));
  EXPECT_TRUE(w.check_layer(ex, 0));
  w.tables[3] = -1;
  EXPECT_TRUE(rejects([&] { ex.step(w.inputs()); }, {"inputs.block_tables[0][3]", "-1"}));
}

TEST(WindowedLayers, BadWindowCapSinksAndLayerSpecsAreNamed) {
  AttentionSpec a = dgtest::small_spec(DType::kFloat32);
  World w({a, a}, 2, 256);
  ExecutorConfig base = w.config(2, 256);
  base.layer_specs = {a, a};
  {
    ExecutorConfig c = base;
    c.layer_specs[1].sliding_window = -3;
    EXPECT_TRUE(rejects([&] { Executor ex(c); }, {"layer_specs[1].sliding_window", "-3"}));
  }
  for (float cap : {-1.0f, NAN, INFINITY}) {
    ExecutorConfig c = base;
    c.layer_specs[0].logit_softcap = cap;
    EXPECT_TRUE(rejects([&] { Executor ex(c); }, {"layer_specs[0].logit_softcap"}));
  }
  {
    ExecutorConfig c = base;
    c.spec.sliding_window = -1;
    c.layer_specs.clear();
    EXPECT_TRUE(rejects([&] { Executor ex(c); }, {"spec.sliding_window", "-1"}));
  }
  {
    ExecutorConfig c = base;  // an override for a layer that does not exist
    c.layer_specs.push_back(a);
    EXPECT_TRUE(rejects([&] { Executor ex(c); }, {"layer_specs.size()", "3", "num_layers = 2"}));
  }
  {
    ExecutorConfig c = base;
    std::vector<float> sinks(8, 0.0f);
    c.layers[1].sinks = reinterpret_cast<const float*>(reinterpret_cast<const char*>(sinks.data()) + 2);
    EXPECT_TRUE(rejects([&] { Executor ex(c); }, {"layers[1].sinks", "aligned to 4 bytes"}));
  }
  // rebind_layers checks them too and changes nothing.
  Executor ex(base);
  std::vector<LayerBuffers> layers = base.layers;
  std::vector<float> sinks(8, 0.0f);
  layers[0].sinks = reinterpret_cast<const float*>(reinterpret_cast<const char*>(sinks.data()) + 1);
  EXPECT_TRUE(rejects([&] { ex.rebind_layers(layers); }, {"layers[0].sinks"}));
  w.set_lens({30, 5});
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0)) << "still usable";
}

}  // namespace
