// Every class of bad input listed in docs/bad-input.md: the Error names the parameter, the value and
// what is allowed; nothing ran (outputs, caches, graphs and memory unchanged); a valid step afterwards
// matches the float64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "rel_util.hpp"

namespace dgrel {
namespace {

/// A fresh executor over the rig runs one random valid step that matches the reference.
void expect_valid_step(Rig& rig, int num_seqs = 5, int max_len = 1000) {
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(num_seqs, 1, max_len);
  ex.step(in.view());
  EXPECT_TRUE(rig.check_step(ex, in));
}

// ---------------------------------------------------------------- configuration

struct ConfigCase {
  const char* name;
  std::function<void(ExecutorConfig&)> mutate;
  std::vector<std::string> parts;  // what the message must name: parameter and value
};

std::vector<ConfigCase> config_cases() {
  return {
      {"head_size_unsupported", [](ExecutorConfig& c) { c.spec.head_size = 100; }, {"head_size", "100"}},
      {"head_size_zero", [](ExecutorConfig& c) { c.spec.head_size = 0; }, {"head_size", "0"}},
      {"block_size_unsupported", [](ExecutorConfig& c) { c.spec.block_size = 12; }, {"block_size", "12"}},
      {"num_q_heads_zero", [](ExecutorConfig& c) { c.spec.num_q_heads = 0; }, {"num_q_heads", "0"}},
      {"num_kv_heads_negative", [](ExecutorConfig& c) { c.spec.num_kv_heads = -2; }, {"num_kv_heads", "-2"}},
      {"gqa_not_divisible", [](ExecutorConfig& c) { c.spec.num_q_heads = 6; c.spec.num_kv_heads = 4; },
       {"num_kv_heads", "4"}},
      {"dtype_out_of_range", [](ExecutorConfig& c) { c.spec.dtype = static_cast<DType>(7); }, {"dtype", "7"}},
      {"layout_out_of_range", [](ExecutorConfig& c) { c.spec.layout = static_cast<KVLayout>(5); },
       {"layout", "5"}},
      {"scale_nan", [](ExecutorConfig& c) { c.spec.scale = std::numeric_limits<float>::quiet_NaN(); },
       {"scale", "nan"}},
      {"alibi_wrong_size", [](ExecutorConfig& c) { c.alibi_slopes = {0.5f, 0.25f, 0.125f}; },
       {"alibi_slopes", "3"}},
      {"num_layers_zero", [](ExecutorConfig& c) { c.num_layers = 0; c.layers.clear(); }, {"num_layers", "0"}},
      {"layers_size_mismatch", [](ExecutorConfig& c) { c.layers.pop_back(); }, {"layers", "1"}},
      {"k_cache_null", [](ExecutorConfig& c) { c.layers[1].k_cache = nullptr; }, {"k_cache"}},
      {"v_cache_null", [](ExecutorConfig& c) { c.layers[0].v_cache = nullptr; }, {"v_cache"}},
      {"max_batch_zero", [](ExecutorConfig& c) { c.max_batch = 0; c.batch_buckets.clear(); },
       {"max_batch", "0"}},
      {"max_seq_len_zero", [](ExecutorConfig& c) { c.max_seq_len = 0; c.band_edges.clear(); },
       {"max_seq_len", "0"}},
      {"num_blocks_zero", [](ExecutorConfig& c) { c.num_blocks = 0; }, {"num_blocks", "0"}},
      {"max_blocks_per_seq_narrow", [](ExecutorConfig& c) { c.max_blocks_per_seq = 10; },
       {"max_blocks_per_seq", "10"}},
      {"max_blocks_per_seq_negative", [](ExecutorConfig& c) { c.max_blocks_per_seq = -1; },
       {"max_blocks_per_seq", "-1"}},
      {"v2_threshold_zero", [](ExecutorConfig& c) { c.v2_threshold = 0; }, {"v2_threshold", "0"}},
      {"band_edges_not_increasing", [](ExecutorConfig& c) { c.band_edges = {512, 256, 1024}; },
       {"band_edges", "256"}},
      {"band_edges_repeated", [](ExecutorConfig& c) { c.band_edges = {256, 512, 512, 1024}; },
       {"band_edges", "512"}},
      {"band_edges_missing_threshold", [](ExecutorConfig& c) { c.band_edges = {256, 768, 1024}; },
       {"band_edges", "512"}},
      {"band_edges_not_ending_at_max", [](ExecutorConfig& c) { c.band_edges = {256, 512, 768}; },
       {"band_edges", "768"}},
      {"band_edges_past_max", [](ExecutorConfig& c) { c.band_edges = {256, 512, 2048}; },
       {"band_edges", "2048"}},
      {"band_edges_nonpositive", [](ExecutorConfig& c) { c.band_edges = {0, 512, 1024}; },
       {"band_edges", "0"}},
      {"batch_buckets_not_increasing", [](ExecutorConfig& c) { c.batch_buckets = {4, 2, 8}; },
       {"batch_buckets", "2"}},
      {"batch_buckets_not_ending_at_max", [](ExecutorConfig& c) { c.batch_buckets = {1, 2, 4}; },
       {"batch_buckets", "4"}},
      {"batch_buckets_past_max", [](ExecutorConfig& c) { c.batch_buckets = {1, 4, 16}; },
       {"batch_buckets", "16"}},
      {"batch_buckets_zero", [](ExecutorConfig& c) { c.batch_buckets = {0, 4, 8}; }, {"batch_buckets", "0"}},
      {"partition_not_multiple", [](ExecutorConfig& c) { c.partition_size = 100; }, {"partition_size", "100"}},
      {"partition_negative", [](ExecutorConfig& c) { c.partition_size = -16; }, {"partition_size", "-16"}},
      {"device_model_sms_negative", [](ExecutorConfig& c) { c.device_model.num_sms = -1; },
       {"device_model.num_sms", "-1"}},
      {"device_model_blocks_per_sm_too_many", [](ExecutorConfig& c) { c.device_model.blocks_per_sm = 100; },
       {"device_model.blocks_per_sm", "100"}},
      {"policy_out_of_range", [](ExecutorConfig& c) { c.policy = static_cast<KernelPolicy>(9); }, {"policy", "9"}},
      {"measure_replays_zero", [](ExecutorConfig& c) { c.measure_replays = 0; }, {"measure_replays", "0", "1..1000"}},
      {"capture_out_of_range", [](ExecutorConfig& c) { c.capture = static_cast<CapturePolicy>(9); },
       {"capture", "9"}},
      {"backend_out_of_range", [](ExecutorConfig& c) { c.backend = static_cast<BackendKind>(9); },
       {"backend", "9"}},
      {"validation_out_of_range", [](ExecutorConfig& c) { c.validation = static_cast<ValidationLevel>(9); },
       {"validation", "9"}},
      {"log_level_unknown", [](ExecutorConfig& c) { c.log_level = "loud"; }, {"log_level", "loud"}},
      {"memory_budget_too_small", [](ExecutorConfig& c) { c.memory_budget_bytes = 4096; },
       {"memory_budget_bytes", "4096"}},
      {"stride_for_owned_buffer", [](ExecutorConfig& c) { c.layers[0].q_stride = 512; },
       {"layers[0].q_stride", "512", "is null"}},
      {"stride_below_a_row",
       [](ExecutorConfig& c) {
         c.layers[1].out = c.layers[1].k_cache;  // any caller buffer: rejected before it is used
         c.layers[1].out_stride = 128;           // a row is 4 heads x 64
       },
       {"layers[1].out_stride", "128", "256 (one row)"}},
      {"stride_not_16_bytes",
       [](ExecutorConfig& c) {
         c.layers[0].new_key = c.layers[0].v_cache;
         c.layers[0].new_key_stride = 130;  // fp32: 4 elements per 16 bytes
       },
       {"layers[0].new_key_stride", "130", "multiple of 4 elements"}},
      {"k_cache_smaller_than_the_spec",
       [](ExecutorConfig& c) { c.layers[1].k_cache_bytes = 8192; },  // one block; 512 blocks need 4 MiB
       {"layers[1].k_cache", "8192 bytes", "4194304 bytes"}},
  };
}

class ConfigBadInput : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(ConfigBadInput, RejectedAtConstructionThenValidStepCorrect) {
  Rig rig;
  ExecutorConfig bad = rig.cfg;
  GetParam().mutate(bad);
  const std::string msg = error_of([&] { Executor ex(bad); });
  EXPECT_TRUE(names(msg, GetParam().parts));
  // The caches the bad configuration pointed at were not written.
  Rig pristine;
  EXPECT_EQ(rig.k_caches, pristine.k_caches);
  EXPECT_EQ(rig.v_caches, pristine.v_caches);
  expect_valid_step(rig);
}

INSTANTIATE_TEST_SUITE_P(Classes, ConfigBadInput, ::testing::ValuesIn(config_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ConfigBadInputCuda, CudaBackendWithoutDeviceIsRejected) {
  if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is present: kCuda is valid here";
  Rig rig;
  ExecutorConfig bad = rig.cfg;
  bad.backend = BackendKind::kCuda;
  const std::string msg = error_of([&] { Executor ex(bad); });
  EXPECT_TRUE(names(msg, {"backend"}));
  expect_valid_step(rig);
}

// ---------------------------------------------------------------- step inputs

struct StepCase {
  const char* name;
  std::function<void(Inputs&, StepInputs&)> mutate;  // edit the host data, then the view
  std::vector<std::string> parts;
};

std::vector<StepCase> step_cases() {
  return {
      {"num_seqs_zero", [](Inputs&, StepInputs& s) { s.num_seqs = 0; }, {"num_seqs", "0"}},
      {"num_seqs_negative", [](Inputs&, StepInputs& s) { s.num_seqs = -3; }, {"num_seqs", "-3"}},
      {"num_seqs_above_max_batch", [](Inputs&, StepInputs& s) { s.num_seqs = 9; }, {"num_seqs", "9"}},
      {"seq_lens_null", [](Inputs&, StepInputs& s) { s.seq_lens = nullptr; }, {"seq_lens"}},
      {"block_tables_null", [](Inputs&, StepInputs& s) { s.block_tables = nullptr; }, {"block_tables"}},
      {"slot_mapping_null", [](Inputs&, StepInputs& s) { s.slot_mapping = nullptr; }, {"slot_mapping"}},
      // seq_len 0 is a padded row (accepted); one whose slot is not negative would append.
      {"seq_len_zero_with_a_slot", [](Inputs& in, StepInputs&) { in.seq_lens[2] = 0; },
       {"slot_mapping[2]", "seq_lens[2] = 0 marks a padded row"}},
      {"seq_len_negative", [](Inputs& in, StepInputs&) { in.seq_lens[0] = -5; }, {"seq_lens", "-5"}},
      {"seq_len_above_max_seq_len", [](Inputs& in, StepInputs&) { in.seq_lens[4] = 1025; },
       {"seq_lens", "1025"}},
      {"stride_too_narrow_for_length",
       [](Inputs& in, StepInputs& s) {
         for (auto& len : in.seq_lens) len = std::min(len, 600);
         in.seq_lens[1] = 700;  // needs 44 blocks of 16; the other rows fit in 40
         s.block_table_stride = 40;
       },
       {"block_table", "700"}},
      {"stride_zero", [](Inputs&, StepInputs& s) { s.block_table_stride = 0; }, {"block_table_stride", "0"}},
      {"block_id_past_num_blocks", [](Inputs& in, StepInputs&) { in.block_tables[0] = 512; },
       {"block", "512"}},
      {"block_id_negative", [](Inputs& in, StepInputs&) { in.block_tables[64 + 1] = -1; }, {"block", "-1"}},
      {"slot_past_cache", [](Inputs& in, StepInputs&) { in.slots[3] = 512 * 16; }, {"slot", "8192"}},
      {"memory_space_out_of_range", [](Inputs&, StepInputs& s) { s.space = static_cast<MemorySpace>(4); },
       {"space", "4"}},
      {"slot_of_position_seq_len",  // the off-by-one: lengths count the new token, slots do not
       [](Inputs& in, StepInputs&) { in.slots[2] += in.seq_lens[2] % 16 == 0 ? -15 : 1; },
       {"slot_mapping[2]", "seq_len - 1"}},
      {"max_seq_len_hint_below_a_length",
       [](Inputs& in, StepInputs& s) { s.max_seq_len = *std::max_element(in.seq_lens.begin(), in.seq_lens.end()) - 1; },
       {"max_seq_len", ">= every seq_len"}},
      {"max_seq_len_hint_above_max", [](Inputs&, StepInputs& s) { s.max_seq_len = 1025; },
       {"max_seq_len", "1025"}},
  };
}

class StepBadInput : public ::testing::TestWithParam<StepCase> {};

TEST_P(StepBadInput, RejectedNothingRanThenValidStepCorrect) {
  Rig rig;
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  // One good step first so a graph exists and the stats have something to keep.
  const Inputs warm = rig.random_inputs(5, 1, 1000);
  ex.step(warm.view());
  ASSERT_TRUE(rig.check_step(ex, warm));

  for (int l = 0; l < rig.cfg.num_layers; ++l)
    dgtest::poison(rig.cfg.spec.dtype, ex.output(l), rig.cfg.max_batch * rig.row_elems());
  rig.fill_step_buffers(ex);
  Inputs bad = rig.random_inputs(5, 300, 1000);
  StepInputs view = bad.view();
  GetParam().mutate(bad, view);
  const Snapshot before = Snapshot::take(rig, ex);
  const std::string msg = error_of([&] { ex.step(view); });
  EXPECT_TRUE(names(msg, GetParam().parts));
  const Snapshot after = Snapshot::take(rig, ex);
  EXPECT_TRUE(same_state(before, after));
  EXPECT_EQ(after.stats.rejected_steps, before.stats.rejected_steps + 1);

  const Inputs good = rig.random_inputs(7, 1, 1024);
  const StepResult r = ex.step(good.view());
  EXPECT_EQ(r.bucket_batch_size, 8);
  EXPECT_TRUE(rig.check_step(ex, good));
  EXPECT_EQ(ex.stats().steps, before.stats.steps + 1);
}

INSTANTIATE_TEST_SUITE_P(Classes, StepBadInput, ::testing::ValuesIn(step_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(StepBadInputCheap, CheapValidationStillChecksCountsLengthsAndWidth) {
  Rig rig;
  rig.cfg.validation = ValidationLevel::kCheap;
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  Inputs in = rig.random_inputs(3, 1, 500);
  in.seq_lens[1] = 2000;
  const Snapshot before = Snapshot::take(rig, ex);
  EXPECT_TRUE(names(error_of([&] { ex.step(in.view()); }), {"seq_lens", "2000"}));
  EXPECT_TRUE(same_state(before, Snapshot::take(rig, ex)));
  StepInputs narrow = in.view();
  for (auto& len : in.seq_lens) len = std::min(len, 100);
  in.seq_lens[1] = 500;  // needs 32 blocks; the other rows fit in 8
  narrow.block_table_stride = 8;
  EXPECT_TRUE(names(error_of([&] { ex.step(narrow); }), {"block_table", "500"}));
  EXPECT_TRUE(same_state(before, Snapshot::take(rig, ex)));
  const Inputs good = rig.random_inputs(3, 1, 1024);
  ex.step(good.view());
  EXPECT_TRUE(rig.check_step(ex, good));
}

TEST(StepBadInputAppendOff, SlotMappingNotNeededWithoutAppend) {
  // The null slot_mapping class exists only because append runs; without it a null mapping is fine.
  Rig rig;
  rig.cfg.append_kv = false;
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(4, 1, 1024);
  StepInputs v = in.view();
  v.slot_mapping = nullptr;
  ex.step(v);
  EXPECT_TRUE(rig.check_step(ex, in));
}

// ---------------------------------------------------------------- layer indices

TEST(LayerIndexBadInput, BufferAccessorsRejectOutOfRange) {
  Rig rig;
  Executor ex(rig.cfg);
  for (int layer : {-1, 2, 100}) {
    const std::string v = std::to_string(layer);
    EXPECT_TRUE(names(error_of([&] { ex.query(layer); }), {"layer", v}));
    EXPECT_TRUE(names(error_of([&] { ex.output(layer); }), {"layer", v}));
    EXPECT_TRUE(names(error_of([&] { ex.new_key(layer); }), {"layer", v}));
    EXPECT_TRUE(names(error_of([&] { ex.new_value(layer); }), {"layer", v}));
  }
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(2, 1, 1024);
  ex.step(in.view());
  EXPECT_TRUE(rig.check_step(ex, in));
}

TEST(LayerIndexBadInput, StepBodyLayerOutOfRangeFailsCaptureCleanly) {
  Rig rig;
  int bad_layer = 2;  // the body asks for a layer that does not exist until the test fixes it
  Executor ex(rig.cfg, [&](StepContext& ctx) {
    for (int l = 0; l < 2; ++l) {
      ctx.append_kv(l);
      ctx.attention(l);
    }
    if (bad_layer >= 0) ctx.attention(bad_layer);
  });
  rig.fill_step_buffers(ex);
  for (int l = 0; l < rig.cfg.num_layers; ++l)
    dgtest::poison(rig.cfg.spec.dtype, ex.output(l), rig.cfg.max_batch * rig.row_elems());
  const Inputs in = rig.random_inputs(3, 1, 200);
  const Snapshot before = Snapshot::take(rig, ex);
  EXPECT_TRUE(names(error_of([&] { ex.step(in.view()); }), {"layer", "2"}));
  const Snapshot after = Snapshot::take(rig, ex);
  EXPECT_TRUE(same_state(before, after));
  EXPECT_EQ(captures_of(after.stats, 4, 0), 0);
  bad_layer = -1;
  const StepResult r = ex.step(in.view());
  EXPECT_TRUE(r.captured);
  EXPECT_TRUE(rig.check_step(ex, in));
  EXPECT_EQ(captures_of(ex.stats(), 4, 0), 1);
}

TEST(LayerIndexBadInput, StepBodyAppendLayerOutOfRange) {
  Rig rig;
  Executor ex(rig.cfg, [&](StepContext& ctx) { ctx.append_kv(-1); });
  const Inputs in = rig.random_inputs(3, 1, 200);
  EXPECT_TRUE(names(error_of([&] { ex.step(in.view()); }), {"layer", "-1"}));
  EXPECT_EQ(ex.stats().total_captures, 0);
}

TEST(StepBodyBadInput, EnqueueHostNullFunctionRejected) {
  Rig rig;
  Executor ex(rig.cfg, [&](StepContext& ctx) {
    ctx.enqueue_host(std::function<void()>{});
    ctx.attention(0);
  });
  const Inputs in = rig.random_inputs(3, 1, 200);
  EXPECT_FALSE(error_of([&] { ex.step(in.view()); }).empty());
  EXPECT_EQ(ex.stats().total_captures, 0);
}

// ---------------------------------------------------------------- eager / host launch arguments

struct EagerRig {
  AttentionSpec spec;
  int num_seqs = 3, stride = 8, num_blocks = 32;
  std::vector<float> q, out, k, v;
  std::vector<int32_t> lens{5, 100, 128}, tables;
  std::mt19937_64 rng{99};
  EagerRig() {
    spec.num_q_heads = 4;
    spec.num_kv_heads = 2;
    spec.head_size = 64;
    spec.block_size = 16;
    spec.dtype = DType::kFloat32;
    spec.layout = KVLayout::kNHD;
    q.resize(num_seqs * 4 * 64);
    out.resize(q.size());
    k.resize(num_blocks * spec.block_elems());
    v.resize(k.size());
    dgtest::fill_uniform(spec.dtype, q.data(), q.size(), rng);
    dgtest::fill_uniform(spec.dtype, k.data(), k.size(), rng);
    dgtest::fill_uniform(spec.dtype, v.data(), v.size(), rng);
    for (int i = 0; i < num_seqs * stride; ++i) tables.push_back((i * 7) % num_blocks);
    dgtest::poison(spec.dtype, out.data(), out.size());
  }
  DecodeArgs args() {
    DecodeArgs a;
    a.spec = spec;
    a.num_seqs = num_seqs;
    a.max_seq_len = 128;
    a.block_table_stride = stride;
    a.num_blocks = num_blocks;
    a.q = q.data();
    a.out = out.data();
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.block_tables = tables.data();
    a.seq_lens = lens.data();
    a.host_seq_lens = lens.data();
    a.host_block_tables = tables.data();
    return a;
  }
  bool out_poisoned() const {
    for (float f : out)
      if (!std::isnan(f)) return false;
    return true;
  }
  ::testing::AssertionResult valid_call_correct(bool v2) {
    DecodeArgs a = args();
    if (v2) {
      const std::size_t ws = v2_workspace_size(spec, num_seqs, a.max_seq_len, 32);
      std::vector<std::uint64_t> w(ws / 8 + 1);
      host::paged_attention_v2(a, 32, w.data(), ws);
    } else {
      host::paged_attention_v1(a);
    }
    std::vector<double> ref(out.size());
    reference::paged_attention(a, ref.data());
    const Tol t = tolerance(spec.dtype);
    return dgtest::check_close(spec.dtype, out.data(), ref.data(), num_seqs, 4, 64, t.atol, t.rtol);
  }
};

struct EagerCase {
  const char* name;
  std::function<void(DecodeArgs&)> mutate;
  std::vector<std::string> parts;
};

std::vector<EagerCase> eager_cases() {
  return {
      {"spec_head_size", [](DecodeArgs& a) { a.spec.head_size = 48; }, {"head_size", "48"}},
      {"spec_block_size", [](DecodeArgs& a) { a.spec.block_size = 64; }, {"block_size", "64"}},
      {"num_seqs_zero", [](DecodeArgs& a) { a.num_seqs = 0; }, {"num_seqs", "0"}},
      {"max_seq_len_zero", [](DecodeArgs& a) { a.max_seq_len = 0; }, {"max_seq_len", "0"}},
      {"stride_too_narrow", [](DecodeArgs& a) { a.block_table_stride = 4; }, {"block_table_stride", "4"}},
      {"num_blocks_zero", [](DecodeArgs& a) { a.num_blocks = 0; }, {"num_blocks", "0"}},
      {"q_null", [](DecodeArgs& a) { a.q = nullptr; }, {"q = "}},
      {"out_null", [](DecodeArgs& a) { a.out = nullptr; }, {"out = "}},
      {"k_cache_null", [](DecodeArgs& a) { a.k_cache = nullptr; }, {"k_cache"}},
      {"v_cache_null", [](DecodeArgs& a) { a.v_cache = nullptr; }, {"v_cache"}},
      {"block_tables_null", [](DecodeArgs& a) { a.block_tables = nullptr; }, {"block_tables"}},
      {"seq_lens_null", [](DecodeArgs& a) { a.seq_lens = nullptr; }, {"seq_lens"}},
      {"q_misaligned", [](DecodeArgs& a) { a.q = static_cast<const char*>(a.q) + 2; }, {"q = "}},
      {"k_cache_misaligned", [](DecodeArgs& a) { a.k_cache = static_cast<const char*>(a.k_cache) + 4; },
       {"k_cache"}},
      {"host_seq_len_above_max", [](DecodeArgs& a) { const_cast<int32_t*>(a.host_seq_lens)[1] = 129; },
       {"seq_len", "129"}},
      {"host_seq_len_negative", [](DecodeArgs& a) { const_cast<int32_t*>(a.host_seq_lens)[2] = -1; },
       {"seq_len", "-1"}},
      {"host_block_id_out_of_range", [](DecodeArgs& a) { const_cast<int32_t*>(a.host_block_tables)[0] = 32; },
       {"block", "32"}},
  };
}

class EagerBadInput : public ::testing::TestWithParam<EagerCase> {};

TEST_P(EagerBadInput, V1AndV2RejectBeforeWritingThenValidCallCorrect) {
  for (bool v2 : {false, true}) {
    SCOPED_TRACE(v2 ? "host v2" : "host v1");
    EagerRig r;
    DecodeArgs a = r.args();
    GetParam().mutate(a);
    const std::vector<float> k0 = r.k, v0 = r.v;
    std::vector<std::uint64_t> ws(v2_workspace_size(r.spec, r.num_seqs, 128, 32) / 8 + 1);
    const std::string msg = error_of([&] {
      if (v2)
        host::paged_attention_v2(a, 32, ws.data(), ws.size() * 8);
      else
        host::paged_attention_v1(a);
    });
    EXPECT_TRUE(names(msg, GetParam().parts));
    EXPECT_TRUE(r.out_poisoned()) << "output written by a rejected call";
    EXPECT_EQ(r.k, k0);
    EXPECT_EQ(r.v, v0);
    EagerRig fresh;  // mutations may have edited the host lengths / tables in place
    EXPECT_TRUE(fresh.valid_call_correct(v2));
  }
}

INSTANTIATE_TEST_SUITE_P(Classes, EagerBadInput, ::testing::ValuesIn(eager_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(EagerBadInputV2, PartitionAndWorkspaceRejected) {
  EagerRig r;
  DecodeArgs a = r.args();
  const std::size_t need = v2_workspace_size(r.spec, r.num_seqs, 128, 32);
  std::vector<std::uint64_t> ws(need / 8 + 1);
  EXPECT_TRUE(names(error_of([&] { host::paged_attention_v2(a, 24, ws.data(), need); }),
                    {"partition_size", "24"}));
  EXPECT_TRUE(names(error_of([&] { host::paged_attention_v2(a, 0, ws.data(), need); }),
                    {"partition_size", "0"}));
  EXPECT_TRUE(names(error_of([&] { host::paged_attention_v2(a, 32, ws.data(), need - 1); }),
                    {"workspace", std::to_string(need - 1)}));
  EXPECT_TRUE(names(error_of([&] { host::paged_attention_v2(a, 32, nullptr, need); }), {"workspace"}));
  EXPECT_TRUE(names(error_of([&] { validate_partition_size(r.spec, -32); }), {"partition_size", "-32"}));
  EXPECT_TRUE(r.out_poisoned());
  EXPECT_TRUE(r.valid_call_correct(true));
}

TEST(EagerBadInputAppend, AppendArgumentsRejectedCacheUnchanged) {
  EagerRig r;
  std::vector<float> key(2 * r.spec.num_kv_heads * 64), value(key.size());
  dgtest::fill_uniform(r.spec.dtype, key.data(), key.size(), r.rng);
  dgtest::fill_uniform(r.spec.dtype, value.data(), value.size(), r.rng);
  std::vector<int64_t> slots{3, 17};
  auto base = [&] {
    AppendArgs a;
    a.spec = r.spec;
    a.num_tokens = 2;
    a.num_blocks = r.num_blocks;
    a.key = key.data();
    a.value = value.data();
    a.k_cache = r.k.data();
    a.v_cache = r.v.data();
    a.slot_mapping = slots.data();
    a.host_slot_mapping = slots.data();
    return a;
  };
  const std::vector<float> k0 = r.k, v0 = r.v;
  struct Case {
    std::function<void(AppendArgs&)> m;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {[](AppendArgs& a) { a.num_tokens = 0; }, {"num_tokens", "0"}},
      {[](AppendArgs& a) { a.num_blocks = -1; }, {"num_blocks", "-1"}},
      {[](AppendArgs& a) { a.key = nullptr; }, {"key = "}},
      {[](AppendArgs& a) { a.value = nullptr; }, {"value = "}},
      {[](AppendArgs& a) { a.k_cache = nullptr; }, {"k_cache"}},
      {[](AppendArgs& a) { a.v_cache = nullptr; }, {"v_cache"}},
      {[](AppendArgs& a) { a.slot_mapping = nullptr; }, {"slot_mapping"}},
      {[](AppendArgs& a) { a.spec.head_size = 72; }, {"head_size", "72"}},
      {[&](AppendArgs&) { slots[1] = 32 * 16; }, {"slot", "512"}},
  };
  for (const auto& c : cases) {
    slots = {3, 17};
    AppendArgs a = base();
    c.m(a);
    EXPECT_TRUE(names(error_of([&] { host::append_kv(a); }), c.parts));
    EXPECT_EQ(r.k, k0);
    EXPECT_EQ(r.v, v0);
  }
  slots = {3, 17};
  host::append_kv(base());
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < r.spec.num_kv_heads; ++h)
      for (int d = 0; d < 64; ++d) {
        const std::size_t src = (t * r.spec.num_kv_heads + h) * 64 + d;
        const std::size_t dst = cache_index(r.spec, true, slots[t] / 16, slots[t] % 16, h, d);
        ASSERT_EQ(r.k[dst], key[src]);
        ASSERT_EQ(r.v[cache_index(r.spec, false, slots[t] / 16, slots[t] % 16, h, d)], value[src]);
      }
}

TEST(SpecBadInput, ParsersAndValidateSpecNameTheValue) {
  EXPECT_TRUE(names(error_of([] { parse_dtype("fp8"); }), {"fp8"}));
  EXPECT_TRUE(names(error_of([] { parse_layout("hnd"); }), {"hnd"}));
  AttentionSpec s;
  s.head_size = 130;
  EXPECT_TRUE(names(error_of([&] { validate_spec(s); }), {"head_size", "130"}));
}

}  // namespace
}  // namespace dgrel
