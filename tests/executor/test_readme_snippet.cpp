// The README's "Using it" snippet, verbatim (extracted from README.md at configure time into
// readme_snippet.inc), compiled inside a test with the engine-side names it uses defined here, and
// run on the host backend: two steps of three sequences through fused QKV buffers, every layer's
// output checked against the float64 reference. A README edit that does not compile fails the build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "decodegraph/decodegraph.hpp"
#include "test_util.hpp"

namespace {

namespace dgn = decodegraph;

/// The engine loop the snippet drives: runs `steps` times.
struct Engine {
  int steps = 0;
  bool running() { return steps-- > 0; }
};

TEST(ReadmeSnippet, CompilesAndRunsOnTheHostBackend) {
  if (dgn::cuda_device_available())
    GTEST_SKIP() << "the snippet picks the CUDA backend on a GPU machine and this harness gives it host "
                    "memory: compiled, not run";
  // The snippet's shapes: 32 layers, 32 q / 8 kv heads, head 128, block 16, bf16, max_batch 64.
  const int layers = 32, q_heads = 32, kv_heads = 8, head = 128, block = 16, max_batch = 64;
  const int64_t row = (q_heads + 2 * kv_heads) * head;
  // A small pool: three sequences of up to 60 tokens, four blocks each, and a spare block.
  const int num_blocks = 13;
  const std::size_t cache_elems = static_cast<std::size_t>(num_blocks) * block * kv_heads * head;
  const std::size_t cache_bytes = cache_elems * sizeof(std::uint16_t);  // bf16
  std::mt19937_64 rng(2024);
  std::vector<std::vector<std::uint16_t>> k_store, v_store, qkv_store, out_store;
  std::vector<void*> k_cache, v_cache;
  std::vector<std::uint16_t*> qkv, attn_out;  // bf16 bits
  for (int l = 0; l < layers; ++l) {
    k_store.emplace_back(cache_elems);
    v_store.emplace_back(cache_elems);
    qkv_store.emplace_back(static_cast<std::size_t>(max_batch) * row);
    out_store.emplace_back(static_cast<std::size_t>(max_batch) * q_heads * head);
    dgtest::fill_uniform(dgn::DType::kBFloat16, k_store.back().data(), cache_elems, rng);
    dgtest::fill_uniform(dgn::DType::kBFloat16, v_store.back().data(), cache_elems, rng);
    dgtest::fill_uniform(dgn::DType::kBFloat16, qkv_store.back().data(), qkv_store.back().size(), rng);
    k_cache.push_back(k_store.back().data());
    v_cache.push_back(v_store.back().data());
    qkv.push_back(qkv_store.back().data());
    attn_out.push_back(out_store.back().data());
  }
  // Sequence i owns blocks 4i .. 4i+3 (block 12 is free); lengths count this step's token.
  const int num_seqs = 3, block_table_stride = 4;
  std::vector<int32_t> lens = {60, 1, 17}, tables(num_seqs * block_table_stride);
  std::vector<int64_t> slots(num_seqs);
  for (int i = 0; i < num_seqs; ++i) {
    for (int j = 0; j < block_table_stride; ++j) tables[i * block_table_stride + j] = 4 * i + j;
    slots[i] = static_cast<int64_t>(tables[i * block_table_stride + (lens[i] - 1) / block]) * block + (lens[i] - 1) % block;
  }
  const int32_t* seq_lens = lens.data();
  const int32_t* block_tables = tables.data();
  const int64_t* slot_mapping = slots.data();
  dgn::Stream stream = nullptr;  // the host backend ignores the stream
  Engine engine{2};              // two steps: the first captures, the second replays

#include "readme_snippet.inc"

  EXPECT_EQ(ex.backend(), dgn::BackendKind::kHost);
  EXPECT_EQ(ex.config().layers[31].k_cache_bytes, cache_bytes) << "the snippet gives the cache sizes";
  EXPECT_EQ(ex.stats().steps, 2);
  EXPECT_EQ(ex.stats().total_captures, 1);
  for (int l : {0, 17, 31}) {
    dgn::DecodeArgs a;
    a.spec = ex.config().spec;
    a.num_seqs = num_seqs;
    a.max_seq_len = 60;
    a.block_table_stride = block_table_stride;
    a.num_blocks = num_blocks;
    a.q = qkv[l];
    a.q_stride = row;
    a.out = attn_out[l];
    a.k_cache = k_cache[l];
    a.v_cache = v_cache[l];
    a.block_tables = block_tables;
    a.seq_lens = seq_lens;
    std::vector<double> ref(static_cast<std::size_t>(num_seqs) * q_heads * head);
    dgn::reference::paged_attention(a, ref.data());  // over the caches as appended
    EXPECT_TRUE(dgtest::check_close(dgn::DType::kBFloat16, attn_out[l], ref.data(), num_seqs, q_heads, head, 8e-3,
                                    1.6e-2))
        << "layer " << l;
  }
}

}  // namespace
