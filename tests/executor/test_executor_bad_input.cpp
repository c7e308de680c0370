// Bad input: every class gets a decodegraph::Error naming the parameter, the value and what is
// allowed; a rejected step launches nothing (outputs and caches are byte-identical), leaves the
// executor's counters unchanged except rejected_steps, and the next valid step is correct.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"

namespace {
using namespace decodegraph;
using dgtest::World;

AttentionSpec spec() {
  AttentionSpec s;
  s.num_q_heads = 4;
  s.num_kv_heads = 2;
  s.head_size = 64;
  s.block_size = 16;
  s.dtype = DType::kFloat32;
  return s;
}

using dgtest::expect_error;

class BadStep : public ::testing::Test {
 protected:
  World w{spec(), 2, 8, 1024, 7};
  Executor ex{w.config(8, 1024)};
  void SetUp() override {
    // One good step first, so a captured graph exists that a bad step could wrongly replay.
    w.set_lens({100, 200, 300});
    w.fill_step(ex);
    ex.step(w.inputs());
    ASSERT_TRUE(w.check_layer(ex, 0));
  }
  // Runs a bad step and checks the Error text and that nothing ran or changed.
  void reject(const StepInputs& in, const std::vector<std::string>& parts) {
    const ExecutorStats before = ex.stats();
    const std::size_t ob = w.q_elems(8) * dtype_size(spec().dtype);
    std::vector<char> out0(ob), k0(w.k[0].bytes);
    dgtest::poison(spec().dtype, ex.output(0), w.q_elems(8));
    std::memcpy(out0.data(), ex.output(0), ob);
    std::memcpy(k0.data(), w.k[0].data(), w.k[0].bytes);
    expect_error([&] { ex.step(in); }, parts);
    const ExecutorStats after = ex.stats();
    EXPECT_EQ(after.steps, before.steps);
    EXPECT_EQ(after.total_captures, before.total_captures);
    EXPECT_EQ(after.rejected_steps, before.rejected_steps + 1);
    EXPECT_EQ(after.replays(KernelKind::kV1), before.replays(KernelKind::kV1));
    EXPECT_EQ(std::memcmp(out0.data(), ex.output(0), ob), 0) << "a rejected step wrote outputs";
    EXPECT_EQ(std::memcmp(k0.data(), w.k[0].data(), w.k[0].bytes), 0) << "a rejected step appended K";
    // The next valid step is correct.
    w.set_lens({50, 500, 1000, 7});
    w.fill_step(ex);
    ex.step(w.inputs());
    EXPECT_TRUE(w.check_layer(ex, 0));
    EXPECT_TRUE(w.check_layer(ex, 1));
  }
};

TEST_F(BadStep, NumSeqsZero) {
  StepInputs in = w.inputs();
  in.num_seqs = 0;
  reject(in, {"inputs.num_seqs = 0", "1..max_batch = 1..8"});
}
TEST_F(BadStep, NumSeqsAboveMaxBatch) {
  StepInputs in = w.inputs();
  in.num_seqs = 9;
  reject(in, {"inputs.num_seqs = 9", "1..max_batch = 1..8"});
}
TEST_F(BadStep, PaddedRowWithASlot) {
  // seq_len 0 is a padded row (test_executor_host.cpp, PaddedRows*); its slot must be negative.
  w.set_lens({10, 20, 30});
  w.lens[1] = 0;
  reject(w.inputs(), {"inputs.slot_mapping[1] = ", "negative: seq_lens[1] = 0 marks a padded row"});
}
TEST_F(BadStep, NegativeSeqLen) {
  w.set_lens({10, 20, 30});
  w.lens[2] = -4;
  reject(w.inputs(), {"inputs.seq_lens[2] = -4", "0 (a padded row) or 1..max_seq_len"});
}
TEST_F(BadStep, SeqLenAboveMaxSeqLen) {
  w.set_lens({10, 20, 30});
  w.lens[0] = 1025;
  reject(w.inputs(), {"inputs.seq_lens[0] = 1025", "1..max_seq_len = 1..1024"});
}
TEST_F(BadStep, BlockTableTooNarrow) {
  w.set_lens({10, 200, 30});
  StepInputs in = w.inputs();
  in.block_table_stride = 12;  // 200 tokens need 13 blocks
  reject(in, {"inputs.block_table_stride = 12", ">= ceil(max seq_len 200 / block_size 16) = 13"});
}
TEST_F(BadStep, BlockIdOutsideNumBlocks) {
  w.set_lens({10, 200, 30});
  w.tables[1 * w.stride + 5] = w.num_blocks;
  reject(w.inputs(), {"inputs.block_tables[1][5] = " + std::to_string(w.num_blocks),
                      "0..num_blocks-1 = 0.." + std::to_string(w.num_blocks - 1)});
}
TEST_F(BadStep, NegativeBlockId) {
  w.set_lens({10, 200, 30});
  w.tables[0] = -1;
  reject(w.inputs(), {"inputs.block_tables[0][0] = -1", "0..num_blocks-1"});
}
TEST_F(BadStep, SlotOutsideTheCache) {
  w.set_lens({10, 200, 30});
  const int64_t cap = static_cast<int64_t>(w.num_blocks) * 16;
  w.slots[2] = cap;
  reject(w.inputs(), {"inputs.slot_mapping[2] = " + std::to_string(cap), std::to_string(cap - 1)});
}
TEST_F(BadStep, NullPointers) {
  w.set_lens({10, 20});
  StepInputs in = w.inputs();
  in.seq_lens = nullptr;
  reject(in, {"inputs.seq_lens = null"});
  in = w.inputs();
  in.block_tables = nullptr;
  reject(in, {"inputs.block_tables = null"});
  in = w.inputs();
  in.slot_mapping = nullptr;
  reject(in, {"inputs.slot_mapping = null", "append_kv is on"});
}
TEST_F(BadStep, LayerIndexOutOfRange) {
  expect_error([&] { ex.query(2); }, {"layer = 2", "0..num_layers-1 = 0..1"});
  expect_error([&] { ex.output(-1); }, {"layer = -1"});
  EXPECT_EQ(ex.stats().rejected_steps, 0);
}

TEST(BadStepBody, LayerIndexOutOfRangeInsideTheBody) {
  World w(spec(), 2, 4, 512, 3);
  int bad_layer = 2;
  Executor ex(w.config(4, 512), [&](StepContext& ctx) {
    ctx.append_kv(0);
    ctx.attention(0);
    ctx.append_kv(1);
    ctx.attention(bad_layer);
  });
  w.set_lens({5, 6});
  w.fill_step(ex);
  expect_error([&] { ex.step(w.inputs()); }, {"layer = 2", "0..num_layers-1 = 0..1"});
  EXPECT_EQ(ex.stats().total_captures, 0);
  bad_layer = 1;
  w.fill_step(ex);
  EXPECT_TRUE(ex.step(w.inputs()).captured);
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_layer(ex, 1));
}

// ---------------------------------------------------------------- configuration

class BadConfig : public ::testing::Test {
 protected:
  World w{spec(), 2, 1, 16384, 5};  // config checks only: one sequence's worth of cache
  ExecutorConfig good() { return w.config(8, 16384); }
  void reject(const ExecutorConfig& c, const std::vector<std::string>& parts) {
    expect_error([&] { Executor ex(c); }, parts);
  }
};

TEST_F(BadConfig, BandEdgesNotIncreasing) {
  ExecutorConfig c = good();
  c.band_edges = {1024, 512, 8192, 16384};
  reject(c, {"band_edges = [1024, 512, 8192, 16384]", "strictly increasing"});
}
TEST_F(BadConfig, BandEdgesWithoutThreshold) {
  ExecutorConfig c = good();
  c.band_edges = {1024, 4096, 16384};
  reject(c, {"band_edges = [1024, 4096, 16384]", "containing v2_threshold = 8192"});
}
TEST_F(BadConfig, BandEdgesNotEndingAtMaxSeqLen) {
  ExecutorConfig c = good();
  c.band_edges = {1024, 8192};
  reject(c, {"band_edges = [1024, 8192]", "ending at max_seq_len = 16384"});
}
TEST_F(BadConfig, BatchBuckets) {
  ExecutorConfig c = good();
  c.batch_buckets = {1, 4, 2, 8};
  reject(c, {"batch_buckets = [1, 4, 2, 8]", "strictly increasing"});
  c.batch_buckets = {1, 4};
  reject(c, {"batch_buckets = [1, 4]", "ending at max_batch = 8"});
  c.batch_buckets = {0, 8};
  reject(c, {"batch_buckets[0] = 0", "positive"});
}
TEST_F(BadConfig, LayersAndCaches) {
  ExecutorConfig c = good();
  c.num_layers = 3;
  reject(c, {"layers.size() = 2", "num_layers = 3"});
  c = good();
  c.layers[1].v_cache = nullptr;
  reject(c, {"layers[1].v_cache = null"});
  c = good();
  c.num_layers = 0;
  c.layers.clear();
  reject(c, {"num_layers = 0", ">= 1"});
}
TEST_F(BadConfig, SizesAndPartition) {
  ExecutorConfig c = good();
  c.max_batch = 0;
  reject(c, {"max_batch = 0"});
  // Past the kernels' grid z a step's launches would fail at capture (issue 39): named up front.
  c = good();
  c.max_batch = 70000;
  c.batch_buckets.clear();
  reject(c, {"max_batch = 70000", "1 .. 65535"});
  c = good();
  c.max_seq_len = 0;
  reject(c, {"max_seq_len = 0"});
  c = good();
  c.num_blocks = 0;
  reject(c, {"num_blocks = 0"});
  c = good();
  c.max_blocks_per_seq = 100;
  reject(c, {"max_blocks_per_seq = 100", "= 1024"});
  c = good();
  c.partition_size = 200;
  reject(c, {"200"});
  c = good();
  c.device_model.num_sms = -1;
  reject(c, {"device_model.num_sms = -1", "0 (the device's, or the host model's) or 1..65536"});
  c = good();
  c.device_model.blocks_per_sm = 65;
  reject(c, {"device_model.blocks_per_sm = 65", "1..64"});
  c = good();
  c.policy = static_cast<KernelPolicy>(7);
  reject(c, {"policy = 7", "kAuto, kThreshold or kMeasured"});
  c = good();
  c.measure_replays = 0;
  reject(c, {"measure_replays = 0", "1..1000"});
}
TEST_F(BadConfig, AlibiSpecLogLevelBackendAndBudget) {
  ExecutorConfig c = good();
  c.alibi_slopes = {1.f, 2.f};
  reject(c, {"alibi_slopes.size() = 2", "num_q_heads = 4"});
  c = good();
  c.spec.head_size = 100;
  reject(c, {"head_size", "100"});
  c = good();
  c.log_level = "loud";
  reject(c, {"log_level = loud", "trace"});
  c = good();
  c.memory_budget_bytes = 1000;
  reject(c, {"memory_budget_bytes = 1000", "bytes needed"});
#if !DECODEGRAPH_HAS_CUDA
  c = good();
  c.backend = BackendKind::kCuda;
  reject(c, {"backend = cuda", "host or auto"});
#endif
}

}  // namespace
