// A configuration per layer (issue 17, "A configuration per layer"): ExecutorConfig::layer_specs,
// layer groups, plans per (layer group, batch bucket, band), and a mixed-layer run on the host
// backend against the float64 reference, under both band choices, kAuto and kMeasured, with
// rebind_layers, the plan table, graph counts and the bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"

namespace {
using namespace decodegraph;
using dgtest::rejects;
using dgtest::World;

// Two layer kinds shaped like Gemma 4's: local layers with more KV heads, global layers with fewer
// and wider ones and their own softmax scale (small sizes, so the host run stays fast).
AttentionSpec local_spec() {
  AttentionSpec s = dgtest::small_spec(DType::kFloat32);
  s.num_q_heads = 8;
  s.num_kv_heads = 4;
  s.head_size = 64;
  return s;  // scale 0: 1/sqrt(64)
}
AttentionSpec global_spec() {
  AttentionSpec s = local_spec();
  s.num_kv_heads = 1;
  s.head_size = 128;
  s.scale = 0.05f;
  return s;
}
// Layers 0 and 2 local (group 0), 1 and 3 global (group 1).
std::vector<AttentionSpec> four_layers() { return {local_spec(), global_spec(), local_spec(), global_spec()}; }

constexpr int kMaxBatch = 7;
constexpr int kMaxLen = 2048;

ExecutorConfig mixed_config(World& w, BandSelect band, KernelPolicy policy) {
  ExecutorConfig c = w.config(kMaxBatch, kMaxLen);
  c.v2_threshold = 512;  // bands 512, 1024, 2048: the V1/V2 threshold inside the run
  c.band_select = band;
  c.policy = policy;
  if (policy == KernelPolicy::kMeasured) {
    // Deterministic and different per group: group 0 prefers V1, group 1 prefers V2 (the shortest
    // P), so band 0 runs V1 in the local layers and V2 in the global ones.
    c.measure_clock = [](const BucketPlan& b, const PlanCandidate& k) {
      if (b.group == 0) return k.kernel == KernelKind::kV1 ? 1.0 : 2.0 + 1e-6 * k.partition_size;
      return k.kernel == KernelKind::kV1 ? 3.0 : 1.0 + 1e-6 * k.partition_size;
    };
  }
  return c;
}

// The launch fields that make two plans' launches identical (what kHost's graph sharing compares).
using Launch = std::tuple<int, int, int, int, int, int>;
Launch launch_of(const BucketPlan& p) {
  return {static_cast<int>(p.kernel), p.batch, p.partition_size, p.max_partitions, p.launch_len, p.grid_y};
}

TEST(LayerGroups, EqualSpecsFormOneGroupNumberedByTheirFirstLayer) {
  World w({global_spec(), local_spec(), global_spec(), local_spec(), local_spec()}, kMaxBatch, 512);
  ExecutorConfig c = w.config(kMaxBatch, 512);
  c.spec = local_spec();  // the shared fields; layer 0 is not of this spec
  Executor ex(c);
  ASSERT_EQ(ex.num_layer_groups(), 2);
  EXPECT_EQ(ex.layer_group(0), 0) << "layer 0 is always in group 0";
  EXPECT_EQ(ex.layer_group(1), 1);
  EXPECT_EQ(ex.layer_group(2), 0);
  EXPECT_EQ(ex.group_layers(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(ex.group_layers(1), (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(ex.layer_spec(0).num_kv_heads, 1);
  EXPECT_EQ(ex.layer_spec(4).num_kv_heads, 4);
  EXPECT_EQ(ex.plans().size(), 2 * ex.plans(0).size());
  for (const BucketPlan& p : ex.plans(1)) EXPECT_EQ(p.group, 1);
  EXPECT_EQ(ex.plan_for(1, BucketIndex(0), 0).group, 1);
  EXPECT_EQ(&ex.plan_for(BucketIndex(0), 0), &ex.plan_for(0, BucketIndex(0), 0)) << "plan_for without a group is group 0's";
  // Without an executor, numbered the same way (for reading plan_buckets' plans by group).
  EXPECT_EQ(layer_groups_of(c), (std::vector<int>{0, 1, 0, 1, 1}));
  ExecutorConfig one = c;
  one.layer_specs.clear();
  EXPECT_EQ(layer_groups_of(one), (std::vector<int>(5, 0))) << "no layer_specs: one group";
}

TEST(LayerGroups, LayerSpecsAllEqualPlanExactlyAsOneSpec) {
  AttentionSpec s = local_spec();
  ExecutorConfig one;
  one.spec = s;
  one.num_layers = 3;
  one.max_batch = 16;
  one.max_seq_len = 16384;
  ExecutorConfig same = one;
  same.spec.num_kv_heads = 2;  // not any layer's: with layer_specs only the shared fields are read
  same.layer_specs.assign(3, s);
  const std::vector<BucketPlan> a = plan_buckets(one), b = plan_buckets(same);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].group, 0);
    EXPECT_EQ(launch_of(a[i]), launch_of(b[i])) << "plan " << i;
    EXPECT_EQ(a[i].graph_id, b[i].graph_id) << "plan " << i;
    EXPECT_EQ(a[i].target_blocks, b[i].target_blocks);
  }
  EXPECT_EQ(format_plan_table(a), format_plan_table(b)) << "one group: no group column";
}

// Each group is planned as a single-spec executor of its spec (and its device model: the pass-1
// kernel's occupancy follows the head size and the GQA group) would be; graph ids aside.
TEST(LayerGroups, EachGroupIsPlannedForItsOwnSpecAndKernel) {
  ExecutorConfig c;
  c.spec = local_spec();
  c.num_layers = 4;
  c.layer_specs = four_layers();
  c.max_batch = 32;
  c.max_seq_len = 32768;
  const std::vector<BucketPlan> mixed = plan_buckets(c);
  bool differ = false;
  for (int g = 0; g < 2; ++g) {
    ExecutorConfig single = c;
    single.layer_specs.clear();
    single.spec = g == 0 ? local_spec() : global_spec();
    single.num_layers = 2;
    const std::vector<BucketPlan> expect = plan_buckets(single);
    ASSERT_EQ(mixed.size(), 2 * expect.size());
    for (std::size_t i = 0; i < expect.size(); ++i) {
      const BucketPlan& p = mixed[g * expect.size() + i];
      EXPECT_EQ(p.group, g);
      EXPECT_EQ(launch_of(p), launch_of(expect[i])) << "group " << g << " plan " << i;
      EXPECT_EQ(p.target_blocks, expect[i].target_blocks) << "group " << g;
      EXPECT_EQ(p.grid_y, (g == 0 ? 4 : 1)) << "one block per (sequence, KV head)";
      EXPECT_EQ(p.merge_grid_z, expect[i].merge_grid_z);
      EXPECT_DOUBLE_EQ(p.predicted_hi.us, expect[i].predicted_hi.us);
      if (g == 1) differ = differ || launch_of(p) != launch_of(mixed[i]);
    }
  }
  EXPECT_TRUE(differ) << "the two groups' plans should differ somewhere, or this test shows nothing";
  // A cell's graph id is the same in every group, and cells share one exactly when every group's
  // launch is identical.
  const std::size_t cells = mixed.size() / 2;
  std::map<std::pair<Launch, Launch>, int> ids;
  for (std::size_t i = 0; i < cells; ++i) {
    EXPECT_EQ(mixed[i].graph_id, mixed[cells + i].graph_id);
    const auto [it, fresh] = ids.emplace(std::make_pair(launch_of(mixed[i]), launch_of(mixed[cells + i])), mixed[i].graph_id);
    EXPECT_EQ(it->second, mixed[i].graph_id) << "cell " << i;
    if (fresh) EXPECT_EQ(mixed[i].graph_id, static_cast<int>(ids.size()) - 1) << "numbered by first use";
  }
}

// The executor test, shaped like Gemma 4 (two groups with different KV heads, head sizes
// and scales): every layer against the float64 reference and the appended slots bitwise, over
// lengths crossing every band and the V1/V2 threshold; each layer's launch is its group's plan.
struct MixedCase {
  BandSelect band;
  KernelPolicy policy;
};

class MixedLayers : public ::testing::TestWithParam<MixedCase> {};

TEST_P(MixedLayers, EveryLayerMatchesTheReferenceAndLaunchesItsGroupsPlan) {
  const MixedCase mc = GetParam();
  World w(four_layers(), kMaxBatch, kMaxLen, 1701);
  Executor ex(mixed_config(w, mc.band, mc.policy));
  ASSERT_EQ(ex.band_select(), mc.band);
  ASSERT_EQ(ex.num_layer_groups(), 2);
  ASSERT_EQ(ex.group_layers(1), (std::vector<int>{1, 3}));

  const std::vector<std::vector<int>> steps = {
      {1, 15, 16, 17, 100, 300, 511},         // band 0 (<= 512)
      {513, 1000, 1, 17, 600, 800, 1023},     // band 1
      {2048, 1500, 33, 512, 513, 2047, 64},   // band 2: 2048 is the last edge
      {7, 512, 200},                          // batch bucket 4, band 0
      {1024, 1025, 9},                        // band 2
  };
  std::map<std::pair<int, KernelKind>, long long> ran;  // (group, kernel) -> steps that ran it
  for (const std::vector<int>& lens : steps) {
    w.set_lens(lens);
    w.fill_step(ex);
    const StepResult r = ex.step(w.inputs());
    ASSERT_GE(r.band, 0) << "host inputs: the band is known on the host";
    for (int l = 0; l < w.num_layers; ++l) {
      EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l << " lengths[0] " << lens[0];
      EXPECT_TRUE(w.check_appended(ex, l)) << "layer " << l;
    }
    for (int g = 0; g < 2; ++g) ++ran[{g, ex.plan_for(g, r.bucket, r.band).kernel}];
    EXPECT_EQ(r.kernel, ex.plan_for(r).kernel) << "StepResult's kernel is group 0's";
  }

  // Graphs: kHost one per distinct step launch (every group's launch identical), kDevice one per
  // batch bucket; the graphs say each group's kernels.
  const ExecutorStats st = ex.stats();
  const std::size_t cells = ex.plans(0).size();
  std::set<std::pair<Launch, Launch>> decided;
  for (std::size_t i = 0; i < cells; ++i) {
    const BucketPlan &a = ex.plans(0)[i], &b = ex.plans(1)[i];
    EXPECT_EQ(a.graph_id, b.graph_id);
    if (a.graph_id >= 0) decided.insert({launch_of(a), launch_of(b)});
  }
  EXPECT_EQ(st.distinct_plans, static_cast<int>(decided.size()));
  if (mc.band == BandSelect::kHost) {
    EXPECT_EQ(st.distinct_graphs, static_cast<int>(decided.size()));
    for (const GraphStats& g : st.graphs) {
      ASSERT_EQ(g.group_kernels.size(), 2u);
      EXPECT_EQ(g.group_kernels[0], g.kernel);
    }
  } else {
    EXPECT_EQ(st.distinct_graphs, static_cast<int>(ex.config().batch_buckets.size()));
    for (const GraphStats& g : st.graphs) {
      ASSERT_EQ(g.group_band_kernels.size(), 2u);
      for (int grp = 0; grp < 2; ++grp)
        for (std::size_t b = 0; b < g.group_band_kernels[grp].size(); ++b)
          EXPECT_EQ(g.group_band_kernels[grp][b], ex.plan_for(grp, BucketIndex(g.graph_id), static_cast<int>(b)).kernel);
      EXPECT_EQ(g.group_band_kernels[0], g.band_kernels);
    }
  }
  for (int g = 0; g < 2; ++g)
    for (KernelKind k : {KernelKind::kV1, KernelKind::kV2})
      EXPECT_EQ(st.replays(k, g), (ran[{g, k}])) << "group " << g << " " << to_string(k);

  if (mc.policy == KernelPolicy::kMeasured) {
    // Each group measured on its own and took its own fastest: band 0 differs between the groups.
    for (const std::vector<int>& lens : {steps[0], steps[3]}) {
      const BucketPlan& p0 = ex.plan_for_batch(static_cast<int>(lens.size()), 0);
      EXPECT_EQ(p0.reason, PlanReason::kMeasuredFastest);
      EXPECT_EQ(p0.kernel, KernelKind::kV1) << "group 0's clock prefers V1";
    }
    for (const BucketPlan& p : ex.plans(1))
      if (p.graph_id >= 0) {
        EXPECT_EQ(p.kernel, KernelKind::kV2) << "group 1's clock prefers V2";
        EXPECT_EQ(p.reason, PlanReason::kMeasuredFastest);
        for (const PlanCandidate& k : p.candidates) EXPECT_GE(k.us, 0) << "every candidate was timed";
      }
    EXPECT_GE(st.measured_buckets, 4);
    long long candidates = 0;  // every group's candidates of every measured cell
    for (const BucketPlan& p : ex.plans())
      if (p.graph_id >= 0) candidates += static_cast<long long>(p.candidates.size());
    EXPECT_EQ(st.candidate_graphs, candidates);
  }

  // Each layer's attention launch is its group's plan's kernel, read off the host twin's launch
  // name (the launch is made to fail; the executor stays usable).
  const int first = mc.band == BandSelect::kDevice ? 1 : 0;  // the band-select node
  for (const std::vector<int>& lens : steps) {
    w.set_lens(lens);
    const StepResult r = ex.step(w.inputs());
    for (int l = 0; l < w.num_layers; ++l) {
      const KernelKind want = ex.plan_for(ex.layer_group(l), r.bucket, r.band).kernel;
      EXPECT_EQ(dgtest::failing_kernel([&] { ex.step(w.inputs()); }, first + 2 * l + 1), to_string(want))
          << "layer " << l << " lengths[0] " << lens[0];
    }
  }
  w.set_lens(steps[2]);
  w.fill_step(ex);
  ex.step(w.inputs());
  for (int l = 0; l < w.num_layers; ++l) EXPECT_TRUE(w.check_layer(ex, l)) << "after the failed launches, layer " << l;
}

INSTANTIATE_TEST_SUITE_P(BothBandChoices, MixedLayers,
                         ::testing::Values(MixedCase{BandSelect::kHost, KernelPolicy::kAuto},
                                           MixedCase{BandSelect::kDevice, KernelPolicy::kAuto},
                                           MixedCase{BandSelect::kHost, KernelPolicy::kMeasured},
                                           MixedCase{BandSelect::kDevice, KernelPolicy::kMeasured}),
                         [](const auto& info) {
                           return std::string(info.param.band == BandSelect::kHost ? "Host" : "Device") +
                                  (info.param.policy == KernelPolicy::kAuto ? "Auto" : "Measured");
                         });

// Layers may also differ in query heads (without ALiBi): owned buffers follow each layer's shape.
TEST(MixedLayers, QueryHeadsMayDifferToo) {
  AttentionSpec wide = local_spec();
  wide.num_q_heads = 16;
  wide.num_kv_heads = 2;
  World w({local_spec(), wide}, 3, 1024, 77);
  ExecutorConfig c = w.config(3, 1024);
  c.v2_threshold = 512;
  Executor ex(c);
  for (const std::vector<int>& lens : {std::vector<int>{1, 300, 17}, std::vector<int>{1024, 513, 2}}) {
    w.set_lens(lens);
    w.fill_step(ex);
    ex.step(w.inputs());
    for (int l = 0; l < 2; ++l) {
      EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l;
      EXPECT_TRUE(w.check_appended(ex, l)) << "layer " << l;
    }
  }
  c.alibi_slopes.assign(8, 0.1f);
  EXPECT_TRUE(rejects([&] { Executor bad(c); }, {"alibi_slopes.size() = 8", "layer_specs[1]", "= 16"}));
}

// rebind_layers checks each layer against its own spec and re-records every layer's launch.
TEST(MixedLayers, RebindChecksAndFollowsEachLayersSpec) {
  for (BandSelect band : {BandSelect::kHost, BandSelect::kDevice}) {
    World w(four_layers(), kMaxBatch, kMaxLen, 4242);
    Executor ex(mixed_config(w, band, KernelPolicy::kAuto));
    w.set_lens({1, 700, 1500, 3, 512, 513, 2000});
    w.fill_step(ex);
    ex.step(w.inputs());

    // New caches (copies), and the world now reads those.
    std::vector<dgtest::Buffer> old_k, old_v;
    std::vector<LayerBuffers> moved = ex.config().layers;
    for (int l = 0; l < w.num_layers; ++l) {
      const std::size_t bytes = static_cast<std::size_t>(w.num_blocks) * w.specs[l].block_elems() * 4;
      dgtest::Buffer nk = dgtest::make_buffer(DType::kFloat32, bytes / 4), nv = dgtest::make_buffer(DType::kFloat32, bytes / 4);
      std::memcpy(nk.data(), w.k[l].data(), bytes);
      std::memcpy(nv.data(), w.v[l].data(), bytes);
      old_k.push_back(std::move(w.k[l]));
      old_v.push_back(std::move(w.v[l]));
      w.k[l] = std::move(nk);
      w.v[l] = std::move(nv);
      moved[l].k_cache = w.k[l].data();
      moved[l].v_cache = w.v[l].data();
      moved[l].k_cache_bytes = moved[l].v_cache_bytes = bytes;
    }
    // Each layer is checked against its own spec: layer 1's blocks are 16 x 1 x 128 floats (8192
    // bytes, layer 0's 16384), and a cache one block short of that is rejected; so is a new-K row
    // stride shorter than layer 3's own row (1 x 128).
    std::vector<LayerBuffers> bad = moved;
    bad[1].k_cache_bytes = static_cast<std::size_t>(w.num_blocks - 1) * global_spec().block_elems() * 4;
    EXPECT_TRUE(rejects([&] { ex.rebind_layers(bad); }, {"layers[1].k_cache", std::to_string(w.num_blocks) + " x 8192"}));
    bad = moved;
    bad[3].new_key_stride = 64;  // one row of layer 0's kind, less than a row of layer 3's (128)
    bad[3].new_key = ex.new_key(3);
    EXPECT_TRUE(rejects([&] { ex.rebind_layers(bad); }, {"layers[3].new_key_stride = 64", ">= 128"}));

    ex.rebind_layers(moved);
    EXPECT_EQ(ex.stats().rebinds, 1);
    w.set_lens({2, 701, 1501, 4, 511, 514, 2001});
    w.fill_step(ex);
    ex.step(w.inputs());
    for (int l = 0; l < w.num_layers; ++l) {
      EXPECT_TRUE(w.check_layer(ex, l)) << to_string(band) << " layer " << l;
      EXPECT_TRUE(w.check_appended(ex, l)) << to_string(band) << " layer " << l;
    }
  }
}

TEST(MixedLayers, PlanTableShowsEachGroupsPlanPerBucketAndWhy) {
  World w(four_layers(), kMaxBatch, kMaxLen, 5);
  Executor ex(mixed_config(w, BandSelect::kHost, KernelPolicy::kAuto));
  const std::string t = ex.plan_table();
  EXPECT_NE(t.find("layer group 0: 2 layers (0, 2): 8 q / 4 kv heads of 64"), std::string::npos) << t;
  EXPECT_NE(t.find("layer group 1: 2 layers (1, 3): 8 q / 1 kv heads of 128"), std::string::npos) << t;
  EXPECT_NE(t.find("scale 0.05;"), std::string::npos) << t;
  // Two group lines, a header, then one row per (group, bucket, band), each with its group and why.
  std::vector<std::string> lines;
  for (std::size_t a = 0, b; a < t.size(); a = b + 1) {
    b = t.find('\n', a);
    lines.push_back(t.substr(a, b - a));
  }
  const std::size_t cells = ex.plans(0).size();
  ASSERT_EQ(lines.size(), 3 + 2 * cells);
  EXPECT_EQ(lines[2].rfind("group ", 0), 0u) << lines[2];
  for (std::size_t i = 0; i < 2 * cells; ++i) {
    const std::string& row = lines[3 + i];
    EXPECT_EQ(std::stoi(row.substr(0, 5)), static_cast<int>(i / cells)) << row;
    EXPECT_NE(row.find(describe_reason(ex.plans()[i])), std::string::npos) << row;
  }
}

TEST(LayerGroupsBadInput, EachMistakeNamesItsParameterAndNothingIsBuilt) {
  World w(four_layers(), kMaxBatch, 512, 9);
  const ExecutorConfig good = w.config(kMaxBatch, 512);
  auto with = [&](auto edit) {
    ExecutorConfig c = good;
    edit(c);
    return c;
  };
  EXPECT_TRUE(rejects([&] { Executor ex(with([](ExecutorConfig& c) { c.layer_specs.pop_back(); })); },
                      {"layer_specs.size() = 3", "num_layers = 4"}));
  EXPECT_TRUE(rejects([&] { plan_buckets(with([](ExecutorConfig& c) { c.layer_specs.push_back(local_spec()); })); },
                      {"layer_specs.size() = 5", "0 (every layer uses spec)"}));
  EXPECT_TRUE(rejects([&] { Executor ex(with([](ExecutorConfig& c) { c.layer_specs[2].block_size = 32; })); },
                      {"layer_specs[2].block_size = 32", "spec.block_size = 16"}));
  EXPECT_TRUE(rejects([&] { Executor ex(with([](ExecutorConfig& c) { c.layer_specs[1].dtype = DType::kBFloat16; })); },
                      {"layer_specs[1].dtype = bf16", "spec.dtype = fp32"}));
  EXPECT_TRUE(rejects([&] { Executor ex(with([](ExecutorConfig& c) { c.layer_specs[3].layout = KVLayout::kNHD; })); },
                      {"layer_specs[3].layout = nhd", "spec.layout = vllm"}));
  EXPECT_TRUE(rejects([&] { Executor ex(with([](ExecutorConfig& c) { c.layer_specs[1].head_size = 100; })); },
                      {"layer_specs[1].head_size = 100", "64, 80"}));
  EXPECT_TRUE(rejects([&] { Executor ex(with([](ExecutorConfig& c) { c.layer_specs[3].scale = -1; })); },
                      {"layer_specs[3].scale"}));
  // The free checks say the same without building anything.
  EXPECT_TRUE(rejects([&] { validate_layer_specs(with([](ExecutorConfig& c) { c.layer_specs[2].block_size = 32; })); },
                      {"layer_specs[2].block_size = 32", "spec.block_size = 16"}));
  EXPECT_TRUE(rejects([&] { layer_groups_of(with([](ExecutorConfig& c) { c.layer_specs.pop_back(); })); },
                      {"layer_specs.size() = 3", "num_layers = 4"}));
  EXPECT_NO_THROW(validate_layer_specs(good));
  // The cache of each layer is checked against its own spec: layer 1's holds 1 x 128 per token.
  EXPECT_TRUE(rejects([&] {
    Executor ex(with([&](ExecutorConfig& c) {
      c.layers[1].k_cache_bytes = static_cast<std::size_t>(w.num_blocks) * global_spec().block_elems() * 4 - 4;
    }));
  }, {"layers[1].k_cache", "x 8192 ="}));

  Executor ex(good);
  EXPECT_TRUE(rejects([&] { ex.layer_group(4); }, {"layer = 4", "0..num_layers-1 = 0..3"}));
  EXPECT_TRUE(rejects([&] { ex.layer_spec(-1); }, {"layer = -1"}));
  EXPECT_TRUE(rejects([&] { ex.plans(2); }, {"group = 2", "a layer group 0..1"}));
  EXPECT_TRUE(rejects([&] { ex.group_layers(-1); }, {"group = -1"}));
  EXPECT_TRUE(rejects([&] { ex.plan_for(2, BucketIndex(0), 0); }, {"group = 2"}));
  // Still usable.
  w.set_lens({5, 300});
  w.fill_step(ex);
  ex.step(w.inputs());
  for (int l = 0; l < 4; ++l) EXPECT_TRUE(w.check_layer(ex, l)) << "layer " << l;
}

}  // namespace
