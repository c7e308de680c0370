// fp8 KV caches through the executor on the host backend (issue 25): steps (append + attention)
// against the float64 reference of the codes and scales, under both band choices and across the
// V1/V2 swap; new scale values between two replays of one graph (no recapture) change the output
// to the new reference; rebind_layers with new scale pointers; the bad input the executor rejects
// (and stays usable after). tests/executor/test_executor_gpu.cpp repeats the replay check on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"

namespace {
using namespace decodegraph;
using dgtest::World;

AttentionSpec fp8_spec(KVCacheDType kv, DType dt, KVLayout layout, int q_heads = 8, int kv_heads = 2,
                       bool per_head = false) {
  AttentionSpec s;
  s.num_q_heads = q_heads;
  s.num_kv_heads = kv_heads;
  s.head_size = 64;
  s.block_size = 16;
  s.dtype = dt;
  s.layout = layout;
  s.kv_dtype = kv;
  s.kv_scale_per_head = per_head;
  return s;
}

std::vector<uint64_t> output_words(const Executor& ex, const World& w, int l) {
  const std::size_t bytes = w.q_elems(static_cast<int>(w.lens.size())) * dtype_size(w.spec.dtype);
  std::vector<uint64_t> v((bytes + 7) / 8, 0);
  std::memcpy(v.data(), const_cast<Executor&>(ex).output(l), bytes);
  return v;
}

using StepParam = std::tuple<KVCacheDType, DType, KVLayout, BandSelect>;
class Fp8Executor : public ::testing::TestWithParam<StepParam> {};

// Lengths grow across bands and the V1/V2 threshold (512 here); each step appends a token per
// sequence (quantised) and every layer's output must match the reference of the codes.
TEST_P(Fp8Executor, StepsMatchReferenceAcrossBands) {
  const auto [kv, dt, layout, band] = GetParam();
  World w(fp8_spec(kv, dt, layout, 8, 2, layout == KVLayout::kNHD), 2, 6, 2048, 5);
  ExecutorConfig c = w.config(6, 2048);
  c.v2_threshold = 512;
  c.band_select = band;
  Executor ex(c);
  for (const std::vector<int>& lens :
       {std::vector<int>{1, 17, 300}, {2, 18, 301, 40}, {600, 3, 1000, 41, 77}, {2047, 1, 900, 5, 5, 1500}}) {
    w.set_lens(lens);
    w.fill_step(ex);
    ex.step(w.inputs());
    for (int l = 0; l < 2; ++l) {
      EXPECT_TRUE(w.check_appended(ex, l)) << "layer " << l;
      EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l << " lengths up to " << lens.back();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Host, Fp8Executor,
                         ::testing::Combine(::testing::Values(KVCacheDType::kFp8E4M3, KVCacheDType::kFp8E5M2),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::Values(KVLayout::kVLLM, KVLayout::kNHD),
                                            ::testing::Values(BandSelect::kHost, BandSelect::kDevice)));

// The scales live in caller memory that the graphs read when they replay: writing new values
// between two replays changes the next replay's output to the new reference, without a capture.
TEST(Fp8ExecutorScales, NewValuesBetweenReplaysNoRecapture) {
  for (BandSelect band : {BandSelect::kHost, BandSelect::kDevice}) {
    World w(fp8_spec(KVCacheDType::kFp8E4M3, DType::kBFloat16, KVLayout::kVLLM, 8, 2, true), 1, 4, 1024, 9);
    ExecutorConfig c = w.config(4, 1024);
    c.band_select = band;
    c.append_kv = false;  // the same cache at both replays
    Executor ex(c);
    w.set_lens({100, 7, 513});
    w.fill_step(ex);
    const StepResult first = ex.step(w.inputs());
    EXPECT_TRUE(first.captured);
    EXPECT_TRUE(w.check_layer(ex, 0));
    const std::vector<uint64_t> before = output_words(ex, w, 0);
    const int captures = ex.stats().total_captures;
    for (float& k : w.k_scales[0]) k *= 4.0f;  // the same pointers, new values
    w.v_scales[0][1] *= 0.5f;
    const StepResult second = ex.step(w.inputs());
    EXPECT_FALSE(second.captured);
    EXPECT_EQ(ex.stats().total_captures, captures) << to_string(band);
    EXPECT_NE(before, output_words(ex, w, 0)) << "new scales did not reach the replay (" << to_string(band) << ")";
    EXPECT_TRUE(w.check_layer(ex, 0)) << "replay after new scales (" << to_string(band) << ")";
  }
}

// rebind_layers points the graphs at other scale buffers (and caches) of the same shapes.
TEST(Fp8ExecutorScales, RebindLayersTakesNewScalePointers) {
  World w(fp8_spec(KVCacheDType::kFp8E5M2, DType::kFloat16, KVLayout::kNHD), 1, 3, 512, 13);
  ExecutorConfig c = w.config(3, 512);
  c.append_kv = false;
  Executor ex(c);
  w.set_lens({30, 200});
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
  std::vector<float> k2 = {w.k_scales[0][0] * 2}, v2 = {w.v_scales[0][0] * 3};
  std::vector<LayerBuffers> layers = ex.config().layers;
  layers[0].k_scale = k2.data();
  layers[0].v_scale = v2.data();
  ex.rebind_layers(layers);
  ex.step(w.inputs());
  w.k_scales[0] = k2;  // the reference reads the World's scales
  w.v_scales[0] = v2;
  EXPECT_TRUE(w.check_layer(ex, 0));
}

// ---------------------------------------------------------------- bad input

TEST(Fp8ExecutorBadInput, RejectedClearlyAndTheExecutorStaysUsable) {
  World w(fp8_spec(KVCacheDType::kFp8E4M3, DType::kBFloat16, KVLayout::kVLLM), 2, 3, 512, 17);
  {
    ExecutorConfig c = w.config(3, 512);
    c.layers[1].k_scale = nullptr;
    dgtest::expect_error([&] { Executor ex(c); }, {"layers[1].k_scale = null", "1 fp32 value(s)", "fp8_e4m3"});
    c = w.config(3, 512);
    c.layers[0].v_scale = nullptr;
    dgtest::expect_error([&] { Executor ex(c); }, {"layers[0].v_scale = null"});
    c = w.config(3, 512);
    c.spec.dtype = DType::kFloat32;
    dgtest::expect_error([&] { Executor ex(c); }, {"dtype", "fp32 with kv_dtype fp8_e4m3", "fp16 or bf16"});
    c = w.config(3, 512);
    c.layers[0].k_cache_bytes = c.num_blocks * c.spec.block_elems() - 1;  // one byte short of fp8's size
    dgtest::expect_error([&] { Executor ex(c); }, {"layers[0].k_cache", std::to_string(c.spec.block_bytes())});
  }
  ExecutorConfig c = w.config(3, 512);
  c.layers[0].k_cache_bytes = c.num_blocks * c.spec.block_bytes();  // exactly fp8's size: accepted
  Executor ex(c);
  w.set_lens({10, 20});
  w.fill_step(ex);
  ex.step(w.inputs());
  ASSERT_TRUE(w.check_layer(ex, 0));
  // A scale that is not finite and > 0 is the host backend's to see (it reads them): the step
  // throws InvalidArgument naming it, and the executor runs again once it is fixed.
  for (float bad : {0.0f, -2.0f, NAN, INFINITY}) {
    const float good = w.v_scales[1][0];
    w.v_scales[1][0] = bad;
    w.set_lens({11, 21});
    w.fill_step(ex);
    dgtest::expect_error([&] { ex.step(w.inputs()); }, {"v_scale[0]", "a finite value > 0"});
    w.v_scales[1][0] = good;
  }
  w.set_lens({12, 22});
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_layer(ex, 1));
  // rebind_layers checks the scales too, and changes nothing when it rejects.
  std::vector<LayerBuffers> layers = ex.config().layers;
  layers[1].v_scale = nullptr;
  dgtest::expect_error([&] { ex.rebind_layers(layers); }, {"layers[1].v_scale = null"});
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 1));
}

// Issue 36: a bad scale or sink names its layer, and is caught before anything runs: at
// construction, in rebind_layers, and before every step (the caller writes scales between steps).
// Before, construction accepted a negative k_scale or a +inf sink, and the step failed in the middle
// of its replay (earlier layers already appended) with "v_scale[0] = nan is invalid", no layer named.
TEST(Fp8ExecutorBadInput, BadScalesAndSinksNameTheLayerAndRunNothing) {
  World w(fp8_spec(KVCacheDType::kFp8E4M3, DType::kBFloat16, KVLayout::kVLLM), 3, 3, 512, 23);
  w.set_sinks(-1.0f, 1.0f);
  {
    const float good = w.k_scales[1][0];
    w.k_scales[1][0] = -0.5f;
    dgtest::expect_error([&] { Executor ex(w.config(3, 512)); },
                         {"layers[1].k_scale[0] = -0.5 is invalid", "a finite value > 0"});
    w.k_scales[1][0] = good;
    w.sinks[2][5] = INFINITY;
    dgtest::expect_error([&] { Executor ex(w.config(3, 512)); },
                         {"layers[2].sinks[5] = inf is invalid", "a finite raw logit or -inf"});
    w.sinks[2][5] = 0.25f;
  }
  const ExecutorConfig c = w.config(3, 512);
  Executor ex(c);
  w.set_lens({10, 20});
  w.fill_step(ex);
  ex.step(w.inputs());
  ASSERT_TRUE(w.check_layer(ex, 2));
  // A NaN written into layer 2's v_scale between steps: rejected before layer 0 or 1 appends.
  w.v_scales[2][0] = NAN;
  w.set_lens({11, 21});
  w.fill_step(ex);
  std::vector<std::vector<char>> before;
  for (int l = 0; l < 3; ++l) {
    const char* k = static_cast<const char*>(w.k[l].data());
    before.emplace_back(k, k + w.k[l].bytes);
  }
  dgtest::expect_error([&] { ex.step(w.inputs()); }, {"layers[2].v_scale[0] = nan is invalid"});
  for (int l = 0; l < 3; ++l)
    EXPECT_EQ(std::memcmp(before[l].data(), w.k[l].data(), w.k[l].bytes), 0) << "layer " << l << " appended";
  EXPECT_EQ(ex.stats().rejected_steps, 1);
  w.v_scales[2][0] = 1.0f / 128;
  ex.step(w.inputs());
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l;
  // rebind_layers: the same checks, and nothing changes when they reject.
  std::vector<float> bad_sinks(8, 0.0f);
  bad_sinks[7] = NAN;
  std::vector<LayerBuffers> layers = ex.config().layers;
  layers[1].sinks = bad_sinks.data();
  dgtest::expect_error([&] { ex.rebind_layers(layers); }, {"layers[1].sinks[7] = nan is invalid"});
  EXPECT_EQ(ex.stats().rebinds, 0);
  w.set_lens({12, 22});
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 1));
}

}  // namespace
