// Programmatic dependent launch under the simulator (README.md, "What it simulates"): (a) the model
// itself on toy kernel pairs: a dependent that reads before griddepcontrol.wait sees poison, one
// that stores before it or never waits fails, one that waits sees its predecessor's writes; (b) the
// real chains, a caller's kernel -> append -> pass 1 (-> merge), over two layers sharing one V2
// workspace, V1 and V2, both pass-1 maths: bitwise the same output with PDL as without, and the
// model ran on every launch of ours.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cuda_runtime.h"
#include "decodegraph/attention.hpp"
#include "kernels/decode_policy.hpp"
#include "sim_device_ops.hpp"
#include "sim_problem.hpp"
#include "sim_runtime.hpp"

#ifndef DECODEGRAPH_SIM
#error "sim_pdl_test.cpp must see the simulator's shims"
#endif

namespace {

using namespace decodegraph;
namespace dev = decodegraph::kernels::dev;
using dgsim::Dev;

// ---------------------------------------------------------------- (a) toy kernel pairs

struct Toy {
  const int* in = nullptr;
  int* out = nullptr;
  int n = 0;
};
constexpr int kToyThreads = 64, kToyBlocks = 3, kToyN = kToyThreads * kToyBlocks;

int toy_index() { return static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); }
// The producer writes out[i] = 3 i + 1 (after its own wait: it may be a dependent too).
void Producer(Toy p) {
  dev::grid_dependency_wait();
  dev::launch_dependents();
  const int i = toy_index();
  if (i < p.n) p.out[i] = 3 * i + 1;
}
// Consumers: out[i] = in[i] + 1, with the wait in the right place or not.
void ConsumerWaitsFirst(Toy p) {
  dev::grid_dependency_wait();
  const int i = toy_index();
  if (i < p.n) p.out[i] = p.in[i] + 1;
}
void ConsumerReadsFirst(Toy p) {
  const int i = toy_index();
  const int v = i < p.n ? p.in[i] : 0;  // hoisted above the wait
  dev::grid_dependency_wait();
  if (i < p.n) p.out[i] = v + 1;
}
void ConsumerStoresFirst(Toy p) {
  const int i = toy_index();
  if (i < p.n) p.out[i] = 0;  // e.g. zeroing an output before the wait
  dev::grid_dependency_wait();
  if (i < p.n) p.out[i] = p.in[i] + 1;
}
// Block 1 exits before the wait (reading and writing nothing): its grid could complete before
// the producer, so a programmatic successor's wait would no longer cover the producer.
void ConsumerExitsBeforeTheWait(Toy p) {
  if (blockIdx.x == 1) return;
  dev::grid_dependency_wait();
  const int i = toy_index();
  if (i < p.n) p.out[i] = p.in[i] + 1;
}
// Only thread 0 of each block waits, at once; the others read later, after their own wait: the
// model holds the block's predecessor back until every thread is parked, so they see the data.
void ConsumerThread0WaitsFirst(Toy p) {
  if (threadIdx.x == 0) dev::grid_dependency_wait();
  __syncthreads();
  dev::grid_dependency_wait();
  const int i = toy_index();
  if (i < p.n) p.out[i] = p.in[i] + 1;
}

void launch(void (*k)(Toy), bool programmatic, const Toy& t) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg;
  cfg.gridDim = dim3(kToyBlocks);
  cfg.blockDim = dim3(kToyThreads);
  cfg.attrs = attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  ASSERT_EQ(cudaLaunchKernelEx(&cfg, k, t), cudaSuccess);
}

// Producer -> consumer (programmatic or not); the consumer's output.
std::vector<int> run_pair(void (*consumer)(Toy), bool programmatic, bool copy_between = false) {
  Dev a(kToyN * sizeof(int)), b(kToyN * sizeof(int));
  launch(Producer, false, Toy{nullptr, static_cast<int*>(a.p), kToyN});
  if (copy_between) {  // a non-kernel operation between them: CUDA orders the dependent fully
    const int zero = 0;
    EXPECT_EQ(cudaMemcpy(b.p, &zero, sizeof zero, cudaMemcpyHostToDevice), cudaSuccess);
  }
  launch(consumer, programmatic, Toy{static_cast<const int*>(a.p), static_cast<int*>(b.p), kToyN});
  std::vector<int> out(kToyN);
  b.fetch(out.data());
  return out;
}

int correct(const std::vector<int>& out) {
  int n = 0;
  for (int i = 0; i < kToyN; ++i) n += out[i] == 3 * i + 2;
  return n;
}

TEST(SimPdl, DependentThatWaitsSeesItsPredecessorsWrites) {
  for (sim::Order order : {sim::Order::kForward, sim::Order::kReverse}) {
    sim::set_order(order);
    const sim::PdlCounts before = sim::pdl_counts();
    EXPECT_EQ(correct(run_pair(ConsumerWaitsFirst, true)), kToyN);
    EXPECT_EQ(correct(run_pair(ConsumerThread0WaitsFirst, true)), kToyN);
    const sim::PdlCounts after = sim::pdl_counts();
    EXPECT_EQ(after.modelled_launches - before.modelled_launches, 2);
    EXPECT_GE(after.held_waits - before.held_waits, 2 * kToyBlocks);  // every block was held back
  }
  sim::set_order(sim::Order::kFromEnv);
}

TEST(SimPdl, ReadBeforeTheWaitSeesPoison) {
  // Programmatic: every element read before the wait is the 0xff poison (-1), so out = 0.
  const std::vector<int> out = run_pair(ConsumerReadsFirst, true);
  EXPECT_EQ(correct(out), 0);
  for (int i = 0; i < kToyN; ++i) ASSERT_EQ(out[i], 0) << i;
  // The same kernel launched in order, or after a copy that follows the producer, is right: the
  // model poisons only what a programmatic launch may see unwritten.
  EXPECT_EQ(correct(run_pair(ConsumerReadsFirst, false)), kToyN);
  EXPECT_EQ(correct(run_pair(ConsumerReadsFirst, true, /*copy_between=*/true)), kToyN);
}

TEST(SimPdlDeathTest, StoreBeforeTheWaitFails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_pair(ConsumerStoresFirst, true), "SIM FAILURE: a store to global memory .* before griddepcontrol.wait");
  EXPECT_EQ(correct(run_pair(ConsumerStoresFirst, false)), kToyN);  // in order: nothing to race with
}

TEST(SimPdlDeathTest, BlockThatExitsBeforeTheWaitFails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_pair(ConsumerExitsBeforeTheWait, true),
               "SIM FAILURE: block \\(1,0,0\\) of a programmatic launch ended with no thread past griddepcontrol.wait");
}

// ---------------------------------------------------------------- (b) the real chains

// The caller's kernel between ours (its QKV projection): copies q and the new K/V rows from
// buffers the host wrote into the buffers our kernels read. Launched plain, as a caller's is.
struct Projection {
  const unsigned char* src[3] = {};
  unsigned char* dst[3] = {};
  std::size_t bytes[3] = {};
};
void CallerProjection(Projection p) {
  for (int b = 0; b < 3; ++b)
    for (std::size_t i = threadIdx.x + blockIdx.x * blockDim.x; i < p.bytes[b]; i += blockDim.x * gridDim.x)
      p.dst[b][i] = p.src[b][i];
}

struct ChainCase {
  AttentionSpec spec;
  bool v2;
};

// One layer's device state: the problem (caches, tables, lengths, output), the q / new K/V the
// caller's kernel writes, their host-written sources and the append's slots (one new token per
// sequence, at its last position).
struct Layer {
  std::unique_ptr<dgtest::Problem> p;
  std::unique_ptr<dgsim::DeviceProblem> d;
  std::unique_ptr<Dev> q, key, value, q_src, key_src, value_src, slots;
  std::size_t kv_bytes = 0;
  int num_tokens = 0;

  Layer(const AttentionSpec& spec, uint64_t seed) {
    dgtest::ProblemSpec ps;
    ps.spec = spec;
    ps.lens = {37, 0, 131, 5, 64};
    ps.distinct_blocks = true;  // the appended slots never collide
    ps.seed = seed;
    p = dgtest::make_problem(ps);
    d = std::make_unique<dgsim::DeviceProblem>(*p);
    num_tokens = p->args.num_seqs;
    kv_bytes = static_cast<std::size_t>(num_tokens) * spec.num_kv_heads * spec.head_size * dtype_size(spec.dtype);
    std::mt19937_64 rng(seed + 100);
    auto kb = dgtest::make_buffer(spec.dtype, kv_bytes / dtype_size(spec.dtype));
    auto vb = dgtest::make_buffer(spec.dtype, kv_bytes / dtype_size(spec.dtype));
    dgtest::fill_uniform(spec.dtype, kb.data(), kv_bytes / dtype_size(spec.dtype), rng, -2.f, 2.f);
    dgtest::fill_uniform(spec.dtype, vb.data(), kv_bytes / dtype_size(spec.dtype), rng, -2.f, 2.f);
    q_src = std::make_unique<Dev>(p->q.bytes, p->q.data());
    key_src = std::make_unique<Dev>(kv_bytes, kb.data());
    value_src = std::make_unique<Dev>(kv_bytes, vb.data());
    q = std::make_unique<Dev>(p->q.bytes);  // garbage until the caller's kernel writes it
    key = std::make_unique<Dev>(kv_bytes);
    value = std::make_unique<Dev>(kv_bytes);
    std::vector<int64_t> s(num_tokens, -1);
    for (int i = 0; i < num_tokens; ++i) {
      const int len = p->lens[i];
      if (len == 0) continue;  // a padded row appends nothing
      const int pos = len - 1, bs = spec.block_size;
      s[i] = static_cast<int64_t>(p->tables[static_cast<std::size_t>(i) * p->args.block_table_stride + pos / bs]) * bs +
             pos % bs;
    }
    slots = std::make_unique<Dev>(s.size() * sizeof(int64_t), s.data());
  }
  // Fresh caches and output, so that both runs start from the same state.
  void reset() {
    dgsim::sim_ok(cudaMemcpy(d->k.p, p->k.data(), p->k.bytes, cudaMemcpyHostToDevice), "k");
    dgsim::sim_ok(cudaMemcpy(d->v.p, p->v.data(), p->v.bytes, cudaMemcpyHostToDevice), "v");
    d->poison(*p);
  }
  // The step's launches for this layer, in stream order.
  void enqueue(bool pdl, bool v2, void* ws, std::size_t ws_bytes, int partition_size) {
    Projection pr;
    pr.src[0] = static_cast<const unsigned char*>(q_src->p);
    pr.dst[0] = static_cast<unsigned char*>(q->p);
    pr.bytes[0] = p->q.bytes;
    pr.src[1] = static_cast<const unsigned char*>(key_src->p);
    pr.dst[1] = static_cast<unsigned char*>(key->p);
    pr.bytes[1] = kv_bytes;
    pr.src[2] = static_cast<const unsigned char*>(value_src->p);
    pr.dst[2] = static_cast<unsigned char*>(value->p);
    pr.bytes[2] = kv_bytes;
    cudaLaunchConfig_t cfg;
    cfg.gridDim = dim3(4);
    cfg.blockDim = dim3(64);
    ASSERT_EQ(cudaLaunchKernelEx(&cfg, CallerProjection, pr), cudaSuccess);

    AppendArgs a;
    a.spec = p->args.spec;
    a.num_tokens = num_tokens;
    a.num_blocks = p->args.num_blocks;
    a.key = key->p;
    a.value = value->p;
    a.k_cache = d->k.p;
    a.v_cache = d->v.p;
    a.slot_mapping = static_cast<const int64_t*>(slots->p);
    a.programmatic_launch = pdl;
    append_kv(a, nullptr);

    DecodeArgs args = d->args;
    args.q = q->p;
    args.programmatic_launch = pdl;
    if (v2)
      paged_attention_v2(args, partition_size, ws, ws_bytes, nullptr);
    else
      paged_attention_v1(args, nullptr);
  }
};

class SimPdlChain : public ::testing::TestWithParam<ChainCase> {};

TEST_P(SimPdlChain, SameBitsWithAndWithoutPdl) {
  const ChainCase c = GetParam();
  constexpr int kLayers = 2;
  std::vector<std::unique_ptr<Layer>> layers;
  for (int l = 0; l < kLayers; ++l) layers.push_back(std::make_unique<Layer>(c.spec, 11 + l));
  const int partition_size = 2 * c.spec.block_size;  // several partitions: the merge has work
  std::size_t ws_bytes = 0;
  for (const auto& l : layers)
    ws_bytes = std::max(ws_bytes, v2_workspace_size(c.spec, l->p->args.num_seqs, l->p->args.max_seq_len, partition_size));
  Dev ws(ws_bytes);  // one workspace for both layers: layer 2's pass 1 rewrites what layer 1's merge read

  std::vector<std::vector<unsigned char>> outs[2];
  for (int pdl = 0; pdl < 2; ++pdl) {
    for (auto& l : layers) l->reset();
    const sim::PdlCounts before = sim::pdl_counts();
    for (auto& l : layers) l->enqueue(pdl != 0, c.v2, ws.p, ws_bytes, partition_size);
    for (auto& l : layers) {
      outs[pdl].emplace_back(l->p->poisoned.bytes);
      l->d->out.fetch(outs[pdl].back().data());
    }
    const sim::PdlCounts after = sim::pdl_counts();
    // Every launch of ours ran the model (append, pass 1, merge), after a kernel each time.
    EXPECT_EQ(after.modelled_launches - before.modelled_launches, pdl ? kLayers * (c.v2 ? 3 : 2) : 0);
    if (pdl) EXPECT_GT(after.held_waits - before.held_waits, 0);
  }
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_EQ(outs[0][l].size(), outs[1][l].size());
    EXPECT_EQ(std::memcmp(outs[0][l].data(), outs[1][l].data(), outs[0][l].size()), 0)
        << "layer " << l << ": the output with PDL differs from the output without";
    // And the output is an attention output: real rows hold no NaN (the poison) and padded rows are
    // untouched.
    std::memcpy(layers[l]->p->out.data(), outs[1][l].data(), outs[1][l].size());
    EXPECT_TRUE(layers[l]->p->padded_rows_untouched()) << "layer " << l;
    const auto& pr = *layers[l]->p;
    const std::size_t row = static_cast<std::size_t>(c.spec.num_q_heads) * c.spec.head_size;
    int nan = 0;
    for (int r = 0; r < pr.rows(); ++r) {
      if (pr.lens[r / pr.args.q_len] == 0) continue;
      for (std::size_t e = 0; e < row; ++e) nan += std::isnan(load_as_float(c.spec.dtype, pr.out.data(), r * row + e));
    }
    EXPECT_EQ(nan, 0) << "layer " << l;
  }
}

using dgtest::make_spec;

std::vector<ChainCase> chain_cases() {
  // fp16 with groups of 4: the tensor-core pass 1; fp32: the CUDA-core one.
  const AttentionSpec tc = make_spec(DType::kFloat16, 64, 16, KVLayout::kVLLM, 8, 2);
  const AttentionSpec cc = make_spec(DType::kFloat32, 64, 16, KVLayout::kNHD, 4, 2);
  return {{tc, false}, {tc, true}, {cc, false}, {cc, true}};
}

INSTANTIATE_TEST_SUITE_P(Sim, SimPdlChain, ::testing::ValuesIn(chain_cases()), [](const auto& info) {
  const ChainCase& c = info.param;
  return std::string(c.spec.dtype == DType::kFloat32 ? "CudaCores" : "TensorCores") + (c.v2 ? "_V2" : "_V1");
});

}  // namespace
