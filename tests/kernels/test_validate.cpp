// One test per class of bad input: each asserts the Error names the parameter, the value and the
// allowed set. Plus the V2 workspace layout.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"

namespace {

using namespace decodegraph;

/// Runs fn, which must throw Error whose message contains every one of `parts`.
::testing::AssertionResult throws_with(const std::function<void()>& fn,
                                       const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const auto& p : parts)
      if (m.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << m << "\" lacks \"" << p << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "no exception";
}

// A valid call: the pointers are never dereferenced by validation except the host_* copies.
struct ValidDecode {
  alignas(16) unsigned char q[64], out[64], k[64], v[64];
  int32_t tables[3 * 8] = {};
  int32_t lens[3] = {100, 1, 128};
  float slopes[8] = {};
  DecodeArgs args;
  ValidDecode() {
    args.spec.num_q_heads = 8;
    args.spec.num_kv_heads = 2;
    args.spec.head_size = 128;
    args.spec.block_size = 16;
    args.spec.dtype = DType::kFloat16;
    args.num_seqs = 3;
    args.max_seq_len = 128;
    args.block_table_stride = 8;
    args.num_blocks = 64;
    args.q = q;
    args.out = out;
    args.k_cache = k;
    args.v_cache = v;
    args.block_tables = tables;
    args.seq_lens = lens;
    for (int i = 0; i < 24; ++i) tables[i] = i;
  }
  void run() const { validate_decode_args(args); }
};

TEST(ValidateDecode, ValidArgumentsPass) {
  ValidDecode c;
  EXPECT_NO_THROW(c.run());
  c.args.alibi_slopes = c.slopes;  // optional
  c.args.host_seq_lens = c.lens;
  c.args.host_block_tables = c.tables;
  EXPECT_NO_THROW(c.run());
  c.args.spec.layout = KVLayout::kNHD;
  c.args.spec.dtype = DType::kFloat32;
  EXPECT_NO_THROW(c.run());
}

TEST(ValidateDecode, HeadSize) {
  ValidDecode c;
  c.args.spec.head_size = 100;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"head_size = 100", "64, 80, 96, 112, 128, 192, 256"}));
}

TEST(ValidateDecode, BlockSize) {
  ValidDecode c;
  c.args.spec.block_size = 12;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"block_size = 12", "8, 16, 32"}));
}

TEST(ValidateDecode, DType) {
  ValidDecode c;
  c.args.spec.dtype = static_cast<DType>(7);
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"dtype = 7", "0 (fp16), 1 (bf16), 2 (fp32)"}));
}

TEST(ValidateDecode, Layout) {
  ValidDecode c;
  c.args.spec.layout = static_cast<KVLayout>(5);
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"layout = 5", "0 (vllm), 1 (nhd)"}));
}

TEST(ValidateDecode, HeadsNotDivisible) {
  ValidDecode c;
  c.args.spec.num_q_heads = 12;
  c.args.spec.num_kv_heads = 5;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"num_q_heads = 12", "multiple of num_kv_heads = 5"}));
}

TEST(ValidateDecode, NonPositiveHeads) {
  ValidDecode c;
  c.args.spec.num_kv_heads = 0;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"num_kv_heads = 0", "a positive integer"}));
  c.args.spec.num_kv_heads = 2;
  c.args.spec.num_q_heads = -4;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"num_q_heads = -4", "a positive integer"}));
}

TEST(ValidateDecode, NonFiniteScale) {
  ValidDecode c;
  c.args.spec.scale = NAN;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"scale = nan", "a finite value"}));
}

TEST(ValidateDecode, NullPointers) {
  for (const char* name : {"q", "out", "k_cache", "v_cache", "block_tables", "seq_lens"}) {
    ValidDecode c;
    const std::string n = name;
    if (n == "q") c.args.q = nullptr;
    if (n == "out") c.args.out = nullptr;
    if (n == "k_cache") c.args.k_cache = nullptr;
    if (n == "v_cache") c.args.v_cache = nullptr;
    if (n == "block_tables") c.args.block_tables = nullptr;
    if (n == "seq_lens") c.args.seq_lens = nullptr;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {n + " = null", "a non-null pointer aligned to"})) << n;
  }
}

TEST(ValidateDecode, MisalignedPointers) {
  ValidDecode c;
  c.args.q = c.q + 2;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"q = ", "aligned to 16 bytes"}));
  c.args.q = c.q;
  c.args.v_cache = c.v + 8;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"v_cache = ", "aligned to 16 bytes"}));
  c.args.v_cache = c.v;
  c.args.alibi_slopes = reinterpret_cast<const float*>(reinterpret_cast<const char*>(c.slopes) + 1);
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"alibi_slopes = ", "aligned to 4 bytes"}));
  c.args.alibi_slopes = nullptr;
  c.args.seq_lens = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(c.lens) + 2);
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"seq_lens = ", "aligned to 4 bytes"}));
}

TEST(ValidateDecode, Counts) {
  {
    ValidDecode c;
    c.args.num_seqs = 0;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"num_seqs = 0", "a positive integer"}));
    c.args.num_seqs = -3;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"num_seqs = -3", "a positive integer"}));
  }
  {
    ValidDecode c;
    c.args.max_seq_len = 0;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"max_seq_len = 0", "a positive integer"}));
  }
  {
    ValidDecode c;
    c.args.num_blocks = 0;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"num_blocks = 0", "a positive integer"}));
  }
}

TEST(ValidateDecode, BlockTableTooNarrow) {
  ValidDecode c;
  c.args.max_seq_len = 129;  // needs 9 columns of 16
  EXPECT_TRUE(throws_with([&] { c.run(); },
                          {"block_table_stride = 8", "at least ceil(max_seq_len / block_size)",
                           "ceil(129 / 16) = 9"}));
  c.args.block_table_stride = 9;
  EXPECT_NO_THROW(c.run());
  c.args.block_table_stride = 0;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"block_table_stride = 0"}));
}

TEST(ValidateDecode, HostSeqLens) {
  ValidDecode c;
  c.args.host_seq_lens = c.lens;
  // 0 marks a padded row: one rule everywhere (validation, kernels, host path, reference).
  c.lens[1] = 0;
  EXPECT_NO_THROW(c.run());
  c.lens[1] = -1;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"seq_lens[1] = -1", "0 (padded row) .. max_seq_len = 0 .. 128"}));
  c.lens[1] = -5;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"seq_lens[1] = -5", "0 .. 128"}));
  c.lens[1] = 129;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"seq_lens[1] = 129", "0 .. 128"}));
  // Without the host copy the device lengths are not read.
  c.args.host_seq_lens = nullptr;
  EXPECT_NO_THROW(c.run());
}

TEST(ValidateDecode, HostBlockTables) {
  ValidDecode c;
  c.args.host_seq_lens = c.lens;  // 100, 1, 128 -> 7, 1, 8 entries used
  c.args.host_block_tables = c.tables;
  c.tables[8 + 1] = -1;  // seq 1 uses only entry 0: ignored
  c.tables[7] = 999;     // seq 0 uses entries 0..6: ignored
  EXPECT_NO_THROW(c.run());
  c.tables[6] = 64;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"block_tables[0][6] = 64", "0 .. num_blocks - 1 = 0 .. 63"}));
  c.tables[6] = 6;
  c.tables[16 + 7] = -2;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"block_tables[2][7] = -2", "0 .. 63"}));
  // Without host lengths, the entries max_seq_len would use are checked.
  c.tables[16 + 7] = 1;
  c.args.host_seq_lens = nullptr;
  EXPECT_TRUE(throws_with([&] { c.run(); }, {"block_tables[0][7] = 999"}));
}

TEST(ValidatePartition, PositiveMultipleOfBlockSize) {
  AttentionSpec s;
  s.block_size = 16;
  EXPECT_NO_THROW(validate_partition_size(s, 16));
  EXPECT_NO_THROW(validate_partition_size(s, 512));
  for (int bad : {0, -16, 100, 8})
    EXPECT_TRUE(throws_with([&] { validate_partition_size(s, bad); },
                            {"partition_size = " + std::to_string(bad),
                             "a positive multiple of block_size = 16"}));
}

// ---------------------------------------------------------------- V2 workspace layout

TEST(V2Workspace, LayoutIsAlignedAndLargeEnough) {
  AttentionSpec s;
  s.num_q_heads = 12;
  s.num_kv_heads = 4;
  s.head_size = 80;
  for (int num_seqs : {1, 7, 17})
    for (int max_len : {1, 255, 256, 257, 8193, 100000})
      for (int P : {256, 512, 1024}) {
        const auto w = v2_workspace_layout(s, num_seqs, max_len, P);
        EXPECT_EQ(w.max_partitions, (max_len + P - 1) / P);
        const std::size_t rows = std::size_t(num_seqs) * 12 * w.max_partitions;
        EXPECT_EQ(w.max_logits_offset % 256, 0u);
        EXPECT_EQ(w.exp_sums_offset % 256, 0u);
        EXPECT_EQ(w.partial_out_offset % 256, 0u);
        EXPECT_EQ(w.total_bytes % 256, 0u);
        // Sub-buffers in order, disjoint, each big enough.
        EXPECT_GE(w.exp_sums_offset, w.max_logits_offset + rows * 4);
        EXPECT_GE(w.partial_out_offset, w.exp_sums_offset + rows * 4);
        EXPECT_GE(w.total_bytes, w.partial_out_offset + rows * 80 * 4);
        // And no more than 256 bytes of padding each.
        EXPECT_LT(w.total_bytes, rows * (80 + 2) * 4 + 3 * 256);
        EXPECT_EQ(v2_workspace_size(s, num_seqs, max_len, P), w.total_bytes);
      }
}

TEST(V2Workspace, RejectsBadArguments) {
  AttentionSpec s;
  EXPECT_TRUE(throws_with([&] { v2_workspace_layout(s, 0, 100, 256); }, {"num_seqs = 0"}));
  EXPECT_TRUE(throws_with([&] { v2_workspace_layout(s, 2, -1, 256); }, {"max_seq_len = -1"}));
  EXPECT_TRUE(throws_with([&] { v2_workspace_size(s, 2, 100, 250); },
                          {"partition_size = 250", "block_size = 16"}));
  s.head_size = 65;
  EXPECT_TRUE(throws_with([&] { v2_workspace_size(s, 2, 100, 256); }, {"head_size = 65"}));
}

// ---------------------------------------------------------------- append

struct ValidAppend {
  alignas(16) unsigned char key[64], value[64], kc[64], vc[64];
  int64_t slots[4] = {0, 5, -1, 63};
  AppendArgs args;
  ValidAppend() {
    args.spec.block_size = 16;
    args.num_tokens = 4;
    args.num_blocks = 4;  // 64 slots
    args.key = key;
    args.value = value;
    args.k_cache = kc;
    args.v_cache = vc;
    args.slot_mapping = slots;
    args.host_slot_mapping = slots;
  }
  void run() const { validate_append_args(args); }
};

TEST(ValidateAppend, ValidArgumentsPass) {
  ValidAppend c;
  EXPECT_NO_THROW(c.run());
}

TEST(ValidateAppend, CountsPointersAndSlots) {
  {
    ValidAppend c;
    c.args.num_tokens = 0;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"num_tokens = 0", "a positive integer"}));
  }
  {
    ValidAppend c;
    c.args.num_blocks = -1;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"num_blocks = -1", "a positive integer"}));
  }
  {
    ValidAppend c;
    c.args.key = nullptr;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"key = null", "aligned to 16 bytes"}));
    c.args.key = c.key;
    c.args.v_cache = c.vc + 4;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"v_cache = ", "aligned to 16 bytes"}));
    c.args.v_cache = c.vc;
    c.args.slot_mapping = nullptr;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"slot_mapping = null", "aligned to 8 bytes"}));
  }
  {
    ValidAppend c;
    c.slots[3] = 64;
    EXPECT_TRUE(throws_with([&] { c.run(); },
                            {"slot_mapping[3] = 64", "negative value (skipped)",
                             "0 .. num_blocks * block_size - 1 = 0 .. 63"}));
    c.args.host_slot_mapping = nullptr;  // device copy is never read
    EXPECT_NO_THROW(c.run());
  }
  {
    ValidAppend c;
    c.args.spec.head_size = 100;
    EXPECT_TRUE(throws_with([&] { c.run(); }, {"head_size = 100"}));
  }
}

}  // namespace
