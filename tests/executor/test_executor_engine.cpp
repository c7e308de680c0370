// The executor embedded in an engine (issue 11), on the host backend: the caller's stream, a fused
// QKV buffer through row strides (step() and a step body), the max_seq_len hint for device inputs,
// inputs written straight into the host staging buffers, rebind_layers, cache sizes, the slot of
// position seq_len - 1, and block ids kCheap does not check (clamped, reported at the next step or
// check_errors()). Every output is checked against the float64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "exec_world.hpp"

namespace {
using namespace decodegraph;
using dgtest::World;

AttentionSpec spec(DType dtype = DType::kFloat32, KVLayout layout = KVLayout::kVLLM) {
  AttentionSpec s = dgtest::small_spec(dtype, layout);
  s.num_q_heads = 8;
  return s;
}

using dgtest::rejects;

/// float64 reference of layer l over the world's current inputs, q rows q_stride elements apart.
std::vector<double> reference(const World& w, int l, const void* q, int64_t q_stride,
                              const std::vector<int32_t>* tables = nullptr) {
  DecodeArgs a;
  a.spec = w.spec;
  a.num_seqs = static_cast<int>(w.lens.size());
  a.max_seq_len = *std::max_element(w.lens.begin(), w.lens.end());
  a.block_table_stride = w.stride;
  a.num_blocks = w.num_blocks;
  a.q_stride = q_stride;
  a.q = q;
  a.out = const_cast<void*>(q);  // not written by the reference; validation wants a pointer
  a.k_cache = w.k[l].data();
  a.v_cache = w.v[l].data();
  a.block_tables = tables ? tables->data() : w.tables.data();
  a.seq_lens = w.lens.data();
  std::vector<double> ref(w.q_elems(a.num_seqs), 0.0);
  reference::paged_attention(a, ref.data());
  return ref;
}

/// Output rows [0, n) of a buffer whose rows are `stride` elements apart, checked against ref.
::testing::AssertionResult check_rows(const World& w, const void* out, int64_t stride, const std::vector<double>& ref,
                                      const std::vector<bool>& mask = {}) {
  const int n = static_cast<int>(w.lens.size());
  const std::size_t row = static_cast<std::size_t>(w.spec.num_q_heads) * w.spec.head_size;
  const std::size_t es = dtype_size(w.spec.dtype);
  dgtest::Buffer packed(n * row * es);
  for (int i = 0; i < n; ++i)
    std::memcpy(static_cast<char*>(packed.data()) + i * row * es,
                static_cast<const char*>(out) + i * (stride ? stride : row) * es, row * es);
  const dgtest::Tol t = dgtest::tol_for(w.spec.dtype);
  return dgtest::check_close(w.spec.dtype, packed.data(), ref.data(), n, w.spec.num_q_heads, w.spec.head_size,
                             t.atol, t.rtol, mask);
}

// ---------------------------------------------------------------- the caller's stream

// Host backend: any stream (nullptr = the legacy default stream, or any handle) is accepted and
// ignored; each step still runs and is correct, and no stream means the executor's own.
TEST(CallerStream, HostBackendAcceptsAndIgnoresTheStream) {
  World w(spec(), 2, 8, 1024, 3);
  Executor ex(w.config(8, 1024));
  EXPECT_EQ(ex.stream(), nullptr);
  const Stream fake = reinterpret_cast<Stream>(static_cast<std::uintptr_t>(0x5000));
  const std::vector<std::vector<int>> lens = {{17, 300, 1}, {640, 2, 33, 100}, {1000}, {16, 15, 257}};
  for (std::size_t k = 0; k < lens.size(); ++k) {
    w.set_lens(lens[k]);
    w.fill_step(ex);
    if (k % 3 == 0) ex.step(w.inputs(), nullptr);
    else if (k % 3 == 1) ex.step(w.inputs(), fake);
    else ex.step(w.inputs());
    EXPECT_TRUE(w.check_layer(ex, 0)) << "step " << k;
    EXPECT_TRUE(w.check_layer(ex, 1)) << "step " << k;
    EXPECT_TRUE(w.check_appended(ex, 1)) << "step " << k;
  }
  EXPECT_EQ(ex.stats().steps, 4);
  EXPECT_NO_THROW(ex.check_errors());  // a sync point: returns at once on the host
}

// ---------------------------------------------------------------- fused QKV through row strides

/// A fused QKV buffer per layer [max_batch, (hq + 2 hk) * d] as an engine's QKV GEMM writes it, and
/// an output buffer with padded rows: every layer buffer is strided.
struct Fused {
  int64_t qkv_row = 0, out_row = 0;
  std::vector<dgtest::Buffer> qkv, out;
  Fused(const World& w, int max_batch) {
    const AttentionSpec& s = w.spec;
    qkv_row = static_cast<int64_t>(s.num_q_heads + 2 * s.num_kv_heads) * s.head_size;
    out_row = static_cast<int64_t>(s.num_q_heads) * s.head_size + 32;  // 32 spare elements per row
    for (int l = 0; l < w.num_layers; ++l) {
      qkv.push_back(dgtest::make_buffer(s.dtype, max_batch * qkv_row));
      out.push_back(dgtest::make_buffer(s.dtype, max_batch * out_row));
    }
  }
  char* base(int l) { return static_cast<char*>(qkv[l].data()); }
  void* q(int l) { return base(l); }
  void* key(int l, const AttentionSpec& s) {
    return base(l) + static_cast<std::size_t>(s.num_q_heads) * s.head_size * dtype_size(s.dtype);
  }
  void* value(int l, const AttentionSpec& s) {
    return base(l) + static_cast<std::size_t>(s.num_q_heads + s.num_kv_heads) * s.head_size * dtype_size(s.dtype);
  }
  void bind(ExecutorConfig& c) {
    for (int l = 0; l < c.num_layers; ++l) {
      c.layers[l].q = q(l);
      c.layers[l].new_key = key(l, c.spec);
      c.layers[l].new_value = value(l, c.spec);
      c.layers[l].out = out[l].data();
      c.layers[l].q_stride = c.layers[l].new_key_stride = c.layers[l].new_value_stride = qkv_row;
      c.layers[l].out_stride = out_row;
    }
  }
  /// The step's "GEMM": random rows, never all zeros, into every row (padded ones too).
  void fill(const World& w, std::mt19937_64& rng, int max_batch) {
    for (int l = 0; l < w.num_layers; ++l) {
      dgtest::fill_uniform(w.spec.dtype, qkv[l].data(), max_batch * qkv_row, rng);
      dgtest::poison(w.spec.dtype, out[l].data(), max_batch * out_row);
    }
  }
  /// Each live row's new K/V (read from the fused rows) sits at its slot in the cache.
  ::testing::AssertionResult appended(const World& w, int l) {
    const AttentionSpec& s = w.spec;
    const int x = math::vllm_x(static_cast<int>(dtype_size(s.dtype)));
    for (std::size_t i = 0; i < w.lens.size(); ++i) {
      const int64_t block = w.slots[i] / s.block_size;
      const int tok = static_cast<int>(w.slots[i] % s.block_size);
      for (int h = 0; h < s.num_kv_heads; ++h)
        for (int d = 0; d < s.head_size; ++d) {
          const std::size_t src = i * qkv_row + static_cast<std::size_t>(h) * s.head_size + d;
          const float ek = load_as_float(s.dtype, key(l, s), src);
          const float ev = load_as_float(s.dtype, value(l, s), src);
          const float gk = load_as_float(s.dtype, w.k[l].data(),
                                         math::k_offset(s.layout, block, h, tok, d, s.num_kv_heads, s.head_size,
                                                        s.block_size, x));
          const float gv = load_as_float(s.dtype, w.v[l].data(),
                                         math::v_offset(s.layout, block, h, tok, d, s.num_kv_heads, s.head_size,
                                                        s.block_size));
          if (gk != ek || gv != ev)
            return ::testing::AssertionFailure() << "layer " << l << " seq " << i << " head " << h << " d " << d
                                                 << ": cache " << gk << "/" << gv << ", fused row " << ek << "/" << ev;
        }
    }
    return ::testing::AssertionSuccess();
  }
  /// Rows [from, to) of layer l's output are still the poison (padded rows are never written).
  bool untouched(const World& w, int l, int from, int to) {
    for (int64_t i = from * out_row; i < to * out_row; ++i)
      if (!std::isnan(load_as_float(w.spec.dtype, out[l].data(), static_cast<std::size_t>(i)))) return false;
    return true;
  }
};

using FusedParam = std::tuple<DType, KVLayout, bool>;  // dtype, layout, through a step body
class FusedQkv : public ::testing::TestWithParam<FusedParam> {};

TEST_P(FusedQkv, StridedLayerBuffersMatchTheReference) {
  const auto [dtype, layout, with_body] = GetParam();
  const AttentionSpec s = spec(dtype, layout);
  const int max_batch = 17, max_len = 2048;
  World w(s, 2, max_batch, max_len, 41);
  ExecutorConfig c = w.config(max_batch, max_len);
  c.v2_threshold = 512;  // V1 up to 512, V2 (partitions of 256) above: both kernels see the strides
  c.partition_size = 256;
  c.policy = KernelPolicy::kThreshold;
  Fused f(w, max_batch);
  f.bind(c);
  int body_calls = 0;
  StepBody body;
  if (with_body)
    body = [&](StepContext& ctx) {
      ++body_calls;
      for (int l = 0; l < 2; ++l) {
        ctx.append_kv(l);
        ctx.attention(l);
      }
    };
  Executor ex(c, body);
  EXPECT_EQ(ex.query(1), f.q(1));
  EXPECT_EQ(ex.new_key(0), f.key(0, s));
  // Irregular lengths: 1, block +- 1, partition +- 1, and sequences spanning several partitions.
  const std::vector<std::vector<int>> steps = {
      {1, 15, 16, 17, 255, 256, 257},                    // batch 7, V1 band
      {511, 512, 2, 100, 300, 40, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18},  // batch 17
      {513, 2048, 1000, 1, 767, 769, 2047},              // V2, many partitions
  };
  for (std::size_t k = 0; k < steps.size(); ++k) {
    w.set_lens(steps[k]);
    f.fill(w, w.rng, max_batch);
    const StepResult r = ex.step(w.inputs());
    const int n = static_cast<int>(w.lens.size());
    for (int l = 0; l < 2; ++l) {
      EXPECT_TRUE(f.appended(w, l)) << "step " << k << " layer " << l;
      EXPECT_TRUE(check_rows(w, f.out[l].data(), f.out_row, reference(w, l, f.q(l), f.qkv_row)))
          << "step " << k << " layer " << l << " " << to_string(r.kernel);
      EXPECT_TRUE(f.untouched(w, l, n, r.bucket_batch_size)) << "a padded output row was written";
    }
  }
  EXPECT_EQ(body_calls, with_body ? ex.stats().total_captures : 0);
}

INSTANTIATE_TEST_SUITE_P(Host, FusedQkv,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                                            ::testing::Values(KVLayout::kVLLM, KVLayout::kNHD),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_body" : "_step");
                         });

// StepContext::attention(layer, q, out, q_stride, out_stride): caller buffers and strides of the
// body's own, with executor-owned new K/V.
TEST(FusedQkv, StepBodyAttentionOnCallerStridedBuffers) {
  const AttentionSpec s = spec(DType::kBFloat16);
  World w(s, 1, 8, 1024, 43);
  ExecutorConfig c = w.config(8, 1024);
  c.append_kv = false;
  Fused f(w, 8);
  Executor ex(c, [&](StepContext& ctx) { ctx.attention(0, f.q(0), f.out[0].data(), f.qkv_row, f.out_row); });
  for (const std::vector<int>& lens : {std::vector<int>{1, 1024, 33}, std::vector<int>{700, 5, 6, 7, 8, 9, 10}}) {
    w.set_lens(lens);
    f.fill(w, w.rng, 8);
    ex.step(w.inputs());
    EXPECT_TRUE(check_rows(w, f.out[0].data(), f.out_row, reference(w, 0, f.q(0), f.qkv_row)));
  }
}

TEST(LayerStrides, RejectedWithTheFieldAndWhatIsAllowed) {
  const AttentionSpec s = spec(DType::kBFloat16);  // 16 bytes = 8 elements; a q row is 512
  World w(s, 2, 4, 512, 47);
  dgtest::Buffer big = dgtest::make_buffer(s.dtype, 4 * 2048);
  auto with = [&](auto edit) {
    ExecutorConfig c = w.config(4, 512);
    edit(c);
    return c;
  };
  EXPECT_TRUE(rejects([&] { Executor ex(with([](ExecutorConfig& c) { c.layers[1].q_stride = 640; })); },
                      {"layers[1].q_stride = 640", "layers[1].q is null", "contiguous"}));
  EXPECT_TRUE(rejects([&] {
    Executor ex(with([&](ExecutorConfig& c) {
      c.layers[0].q = big.data();
      c.layers[0].q_stride = 256;  // shorter than a row
    }));
  }, {"layers[0].q_stride = 256", ">= 512 (one row)"}));
  EXPECT_TRUE(rejects([&] {
    Executor ex(with([&](ExecutorConfig& c) {
      c.layers[0].new_value = big.data();
      c.layers[0].new_value_stride = 130;  // not a multiple of 8 elements
    }));
  }, {"layers[0].new_value_stride = 130", "multiple of 8 elements (16 bytes)"}));
  EXPECT_TRUE(rejects([&] {
    Executor ex(with([&](ExecutorConfig& c) {
      c.layers[1].out = big.data();
      c.layers[1].out_stride = -512;
    }));
  }, {"layers[1].out_stride = -512"}));
}

// ---------------------------------------------------------------- cache sizes

// An fp32 spec over a bf16-sized cache: the host backend checks the sizes the caller gives (the CUDA
// backend also asks the driver: ExecutorGpu.CacheTooSmallForTheSpecIsRejected).
TEST(CacheSize, GivenSizesAreCheckedAgainstTheSpec) {
  const AttentionSpec s = spec(DType::kFloat32);
  World w(s, 2, 4, 512, 53);
  const std::size_t need = static_cast<std::size_t>(w.num_blocks) * s.block_elems() * 4;
  ExecutorConfig c = w.config(4, 512);
  c.layers[1].k_cache_bytes = need / 2;  // what a bf16 cache of the same shape holds
  EXPECT_TRUE(rejects([&] { Executor ex(c); },
                      {"layers[1].k_cache = " + std::to_string(need / 2) + " bytes (layers[1].k_cache_bytes)",
                       "at least num_blocks x block bytes = " + std::to_string(w.num_blocks) + " x " +
                           std::to_string(s.block_elems() * 4) + " = " + std::to_string(need) + " bytes"}));
  c.layers[1].k_cache_bytes = need;
  c.layers[0].v_cache_bytes = need - 1;
  EXPECT_TRUE(rejects([&] { Executor ex(c); }, {"layers[0].v_cache = " + std::to_string(need - 1) + " bytes"}));
  c.layers[0].v_cache_bytes = need;
  Executor ex(c);  // exactly enough
  w.set_lens({100, 1});
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 1));
}

// ---------------------------------------------------------------- the slot of position seq_len - 1

TEST(SlotPosition, KFullRejectsTheSlotOfTheNextPosition) {
  World w(spec(), 1, 4, 512, 59);
  Executor ex(w.config(4, 512));  // kFull
  w.set_lens({40, 16, 100});
  // The classic off-by-one: lengths counted after the append, slots computed from the length before
  // it was incremented, i.e. for position seq_len instead of seq_len - 1.
  const int64_t good = w.slots[1];
  const int64_t next = static_cast<int64_t>(w.seq_blocks[1][1]) * 16 + 0;  // position 16
  w.slots[1] = next;
  w.fill_step(ex);
  EXPECT_TRUE(rejects([&] { ex.step(w.inputs()); },
                      {"inputs.slot_mapping[1] = " + std::to_string(next), "position seq_len - 1 = 15",
                       "block_tables[1][0] * block_size + 15", "= " + std::to_string(good)}));
  EXPECT_EQ(ex.stats().rejected_steps, 1);
  w.slots[1] = -1;  // negative: this sequence's append is skipped, which is allowed
  EXPECT_NO_THROW(ex.step(w.inputs()));
  w.slots[1] = good;
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_appended(ex, 0));
}

// kCheap does not read slots: one past the cache is skipped by the append, as the kernel skips it,
// on the host backend too (host:: alone would throw in the middle of the replay).
TEST(SlotPosition, KCheapSkipsASlotPastTheCacheAsTheKernelDoes) {
  World w(spec(), 1, 4, 512, 61);
  ExecutorConfig c = w.config(4, 512);
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  w.set_lens({40, 16, 100});
  w.slots[1] = static_cast<int64_t>(w.num_blocks) * 16;
  w.fill_step(ex);
  const std::vector<std::uint64_t> k_before = w.k[0].words;
  EXPECT_NO_THROW(ex.step(w.inputs()));
  EXPECT_TRUE(check_rows(w, ex.output(0), 0, reference(w, 0, ex.query(0), 0), {true, false, true}));
  // Only the two other sequences' slots were written.
  const std::size_t per_token = static_cast<std::size_t>(w.spec.num_kv_heads) * w.spec.head_size;
  std::size_t changed = 0;
  for (std::size_t i = 0; i < k_before.size(); ++i) changed += k_before[i] != w.k[0].words[i];
  EXPECT_GT(changed, 0u);
  EXPECT_LE(changed * 8, 2 * per_token * 4) << "more than two tokens' K changed";
}

// ---------------------------------------------------------------- the max_seq_len hint

TEST(MaxSeqLenHint, DeviceInputsWithAHintAreNeverReadBack) {
  World w(spec(DType::kBFloat16), 1, 8, 4096, 61);
  ExecutorConfig c = w.config(8, 4096);  // bands 512 1024 2048 4096
  c.validation = ValidationLevel::kCheap;
  c.band_select = BandSelect::kHost;  // kHost semantics: one graph per distinct plan, band chosen on the host
  Executor ex(c);
  for (int k = 0; k < 4; ++k) {
    w.set_lens({1 + 300 * k, 17, 200});
    w.fill_step(ex);
    StepInputs in = w.inputs();
    in.space = MemorySpace::kDevice;  // on the host backend "device" memory is host memory
    in.max_seq_len = 1500;            // the engine's bound, above every length: band (1024, 2048]
    const StepResult r = ex.step(in);
    EXPECT_EQ(r.band_hi, 2048) << "the band comes from the hint, not from the lengths";
    EXPECT_TRUE(w.check_layer(ex, 0)) << "step " << k;
  }
  EXPECT_EQ(ex.stats().input_downloads, 0);
  // Without the hint, each step copies seq_lens back (synchronously, on CUDA) to find the band.
  StepInputs in = w.inputs();
  in.space = MemorySpace::kDevice;
  w.fill_step(ex);
  EXPECT_EQ(ex.step(in).band_hi, 1024);  // the longest length is 901
  EXPECT_EQ(ex.stats().input_downloads, 1);
  EXPECT_TRUE(w.check_layer(ex, 0));
}

TEST(MaxSeqLenHint, AHintBelowARealLengthIsRejectedWhereTheLengthsAreSeen) {
  World w(spec(), 1, 4, 2048, 67);
  ExecutorConfig c = w.config(4, 2048);
  Executor full(c);  // kFull: device inputs are copied and every length checked against the hint
  c.validation = ValidationLevel::kCheap;
  Executor cheap(c);
  w.set_lens({100, 700, 3});
  StepInputs in = w.inputs();
  in.max_seq_len = 600;
  // Host inputs: the lengths are on the host, so both levels check them.
  for (Executor* ex : {&full, &cheap})
    EXPECT_TRUE(rejects([&] { ex->step(in); },
                        {"inputs.max_seq_len = 600", ">= every seq_len (seq_lens[1] = 700)"}));
  in.space = MemorySpace::kDevice;
  EXPECT_TRUE(rejects([&] { full.step(in); }, {"inputs.max_seq_len = 600", "seq_lens[1] = 700"}));
  EXPECT_EQ(full.stats().input_downloads, 1);  // the lengths, read back to check them
  in.max_seq_len = 2049;
  EXPECT_TRUE(rejects([&] { cheap.step(in); }, {"inputs.max_seq_len = 2049", "0 (no hint) or 1..max_seq_len = 1..2048"}));
  in.max_seq_len = -1;
  EXPECT_TRUE(rejects([&] { cheap.step(in); }, {"inputs.max_seq_len = -1"}));
  in.max_seq_len = 1024;
  in.block_table_stride = 63;  // the hint needs 64 columns staged
  EXPECT_TRUE(rejects([&] { cheap.step(in); }, {"inputs.block_table_stride = 63", "max_seq_len hint 1024", "= 64"}));
  EXPECT_EQ(cheap.stats().input_downloads, 0);
}

// A hint below a real length under kCheap with device inputs is what the executor cannot see: the
// step runs (never out of bounds) and the sequences within the hint are still right.
TEST(MaxSeqLenHint, AWrongHintUnderKCheapOnlyHurtsTheLongerSequence) {
  World w(spec(), 1, 4, 2048, 71);
  ExecutorConfig c = w.config(4, 2048);
  c.validation = ValidationLevel::kCheap;
  c.append_kv = false;
  Executor ex(c);
  w.set_lens({100, 1500, 3, 511});
  w.fill_step(ex);
  StepInputs in = w.inputs();
  in.space = MemorySpace::kDevice;
  in.max_seq_len = 512;  // sequence 1 is longer
  EXPECT_NO_THROW(ex.step(in));
  EXPECT_TRUE(check_rows(w, ex.output(0), 0, reference(w, 0, ex.query(0), 0), {true, false, true, true}));
}

// ---------------------------------------------------------------- host staging in place

TEST(HostStaging, InputsWrittenInPlaceAreNotCopiedAgain) {
  World w(spec(DType::kFloat16), 2, 8, 2048, 73);
  Executor ex(w.config(8, 2048));
  const std::vector<std::vector<int>> steps = {{1, 2048, 17}, {512, 513, 100, 1000, 7}, {33}};
  for (const std::vector<int>& lens : steps) {
    w.set_lens(lens);
    w.fill_step(ex);
    const HostStaging h = ex.host_staging();
    ASSERT_EQ(h.block_table_stride, ex.config().max_blocks_per_seq);
    ASSERT_EQ(h.seq_lens.size(), 8u);
    ASSERT_EQ(h.block_tables.size(), 8u * h.block_table_stride);
    const int n = static_cast<int>(lens.size());
    std::copy(w.lens.begin(), w.lens.end(), h.seq_lens.begin());
    std::copy(w.slots.begin(), w.slots.end(), h.slot_mapping.begin());
    for (int i = 0; i < n; ++i)
      std::copy_n(w.tables.begin() + static_cast<std::ptrdiff_t>(i) * w.stride, std::min(w.stride, h.block_table_stride),
                  h.block_tables.begin() + static_cast<std::ptrdiff_t>(i) * h.block_table_stride);
    StepInputs in;
    in.num_seqs = n;
    in.seq_lens = h.seq_lens.data();
    in.block_tables = h.block_tables.data();
    in.block_table_stride = h.block_table_stride;
    in.slot_mapping = h.slot_mapping.data();
    ex.step(in);
    EXPECT_TRUE(w.check_layer(ex, 0));
    EXPECT_TRUE(w.check_layer(ex, 1));
    EXPECT_TRUE(w.check_appended(ex, 1));
  }
  EXPECT_EQ(ex.stats().staging_copy_bytes, 0);
  // The same step from the caller's own arrays is copied into the staging buffers first.
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_EQ(ex.stats().staging_copy_bytes, 4 + 8 + 3 * 4);  // seq_lens, slot, the 3 table columns of 33 tokens
  EXPECT_TRUE(w.check_layer(ex, 0));
}

TEST(HostStaging, OnlyTheBuffersAsHandedOutAreAccepted) {
  World w(spec(), 1, 4, 512, 79);
  Executor ex(w.config(4, 512));
  w.set_lens({10, 20});
  const HostStaging h = ex.host_staging();
  StepInputs in = w.inputs();
  in.seq_lens = h.seq_lens.data() + 1;  // overlaps the staging buffer, but not at its start
  EXPECT_TRUE(rejects([&] { ex.step(in); }, {"inputs.seq_lens", "exactly host_staging().seq_lens"}));
  in = w.inputs();
  std::copy_n(w.tables.begin(), 2 * w.stride, h.block_tables.begin());
  in.block_tables = h.block_tables.data();
  in.block_table_stride = h.block_table_stride + 1;
  EXPECT_TRUE(rejects([&] { ex.step(in); }, {"inputs.block_table_stride", "host_staging().block_table_stride = 32"}));
  in.block_table_stride = h.block_table_stride;
  in.space = MemorySpace::kDevice;
  EXPECT_TRUE(rejects([&] { ex.step(in); }, {"inputs.space = kDevice", "kHost"}));
  EXPECT_EQ(ex.stats().rejected_steps, 3);
  in.space = MemorySpace::kHost;
  w.fill_step(ex);
  ex.step(in);
  EXPECT_TRUE(w.check_layer(ex, 0));
}

// ---------------------------------------------------------------- rebind_layers

/// A second set of caches with the same shape and other contents.
struct Caches {
  std::vector<dgtest::Buffer> k, v;
  Caches(const World& w, std::mt19937_64& rng) {
    const std::size_t elems = static_cast<std::size_t>(w.num_blocks) * w.spec.block_elems();
    for (int l = 0; l < w.num_layers; ++l) {
      k.push_back(dgtest::make_buffer(w.spec.dtype, elems));
      v.push_back(dgtest::make_buffer(w.spec.dtype, elems));
      dgtest::fill_uniform(w.spec.dtype, k.back().data(), elems, rng);
      dgtest::fill_uniform(w.spec.dtype, v.back().data(), elems, rng);
    }
  }
  std::vector<LayerBuffers> layers() {
    std::vector<LayerBuffers> out;
    for (std::size_t l = 0; l < k.size(); ++l) out.push_back(LayerBuffers{k[l].data(), v[l].data()});
    return out;
  }
  /// Makes these the world's caches (what the reference reads), keeping the old ones in `old`.
  void swap_into(World& w) {
    std::swap(w.k, k);
    std::swap(w.v, v);
  }
};

/// Two graphs of one executor captured over the world's caches; returns the lengths of both steps.
std::vector<std::vector<int>> capture_two(World& w, Executor& ex) {
  const std::vector<std::vector<int>> steps = {{100, 300, 5}, {1500, 700}};
  for (const auto& lens : steps) {
    w.set_lens(lens);
    w.fill_step(ex);
    EXPECT_TRUE(ex.step(w.inputs()).captured);
    EXPECT_TRUE(w.check_layer(ex, 0));
  }
  return steps;
}

TEST(RebindLayers, GraphsUpdateInPlaceAndReadTheNewCaches) {
  World w(spec(DType::kBFloat16), 2, 4, 2048, 83);
  ExecutorConfig c = w.config(4, 2048);
  c.v2_threshold = 1024;
  c.policy = KernelPolicy::kThreshold;  // a V1 graph and a V2 graph
  int body_calls = 0;
  Executor ex(c, [&](StepContext& ctx) {
    ++body_calls;
    for (int l = 0; l < 2; ++l) {
      ctx.append_kv(l);
      ctx.attention(l);
    }
  });
  const auto steps = capture_two(w, ex);
  ASSERT_EQ(body_calls, 2);

  Caches fresh(w, w.rng);
  ex.rebind_layers(fresh.layers());
  EXPECT_EQ(body_calls, 4) << "the body runs again for each captured graph";
  fresh.swap_into(w);  // w.k/w.v are now the new caches; fresh holds the old ones
  const std::vector<std::uint64_t> old_k0 = fresh.k[0].words, old_v1 = fresh.v[1].words;
  EXPECT_EQ(ex.config().layers[0].k_cache, w.k[0].data());

  for (const auto& lens : steps) {  // the same two buckets: replayed, not captured
    w.set_lens(lens);
    w.fill_step(ex);
    EXPECT_FALSE(ex.step(w.inputs()).captured);
    EXPECT_TRUE(w.check_layer(ex, 0)) << "the output must come from the new caches";
    EXPECT_TRUE(w.check_layer(ex, 1));
    EXPECT_TRUE(w.check_appended(ex, 1)) << "the new K/V must go to the new caches";
  }
  EXPECT_EQ(fresh.k[0].words, old_k0) << "an old cache was written after the rebind";
  EXPECT_EQ(fresh.v[1].words, old_v1);

  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.total_captures, 2) << "no graph was captured anew";
  EXPECT_EQ(st.rebinds, 1);
  EXPECT_EQ(st.graph_updates, 2);
  EXPECT_EQ(st.graph_reinstantiations, 0);
  ASSERT_EQ(st.graphs.size(), 2u);
  for (const GraphStats& g : st.graphs) {
    EXPECT_EQ(g.captures, 1);
    EXPECT_EQ(g.updates, 1);
    EXPECT_EQ(g.reinstantiations, 0);
    EXPECT_EQ(g.replays, 2);
  }
}

TEST(RebindLayers, ARefusedUpdateIsReinstantiatedAndCounted) {
  World w(spec(), 1, 4, 2048, 89);
  ExecutorConfig c = w.config(4, 2048);
  Executor ex(c);
  const auto steps = capture_two(w, ex);
  Caches fresh(w, w.rng);
  {
    fault::ScopedFault f(fault::Site::kGraphUpdate);  // the first update is refused
    ex.rebind_layers(fresh.layers());
  }
  fresh.swap_into(w);
  for (const auto& lens : steps) {
    w.set_lens(lens);
    w.fill_step(ex);
    EXPECT_FALSE(ex.step(w.inputs()).captured);
    EXPECT_TRUE(w.check_layer(ex, 0));
  }
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.graph_updates, 1);
  EXPECT_EQ(st.graph_reinstantiations, 1);
  EXPECT_EQ(st.graphs[0].reinstantiations + st.graphs[1].reinstantiations, 1);
  EXPECT_EQ(st.total_captures, 2);
}

// Rejected layers change nothing: the graphs keep reading the old caches.
TEST(RebindLayers, RejectedLayersChangeNothing) {
  World w(spec(DType::kFloat32), 2, 4, 2048, 97);
  Executor ex(w.config(4, 2048));
  const auto steps = capture_two(w, ex);
  Caches fresh(w, w.rng);
  const std::size_t need = static_cast<std::size_t>(w.num_blocks) * w.spec.block_elems() * 4;
  std::vector<LayerBuffers> bad = fresh.layers();
  bad.pop_back();
  EXPECT_TRUE(rejects([&] { ex.rebind_layers(bad); }, {"layers.size() = 1", "num_layers = 2"}));
  bad = fresh.layers();
  bad[1].v_cache = nullptr;
  EXPECT_TRUE(rejects([&] { ex.rebind_layers(bad); }, {"layers[1].v_cache = null"}));
  bad = fresh.layers();
  bad[0].k_cache_bytes = need / 2;
  EXPECT_TRUE(rejects([&] { ex.rebind_layers(bad); }, {"layers[0].k_cache", std::to_string(need) + " bytes"}));
  bad = fresh.layers();
  bad[1].q_stride = 1024;
  EXPECT_TRUE(rejects([&] { ex.rebind_layers(bad); }, {"layers[1].q_stride = 1024", "layers[1].q is null"}));

  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.rebinds, 0);
  EXPECT_EQ(st.graph_updates, 0);
  EXPECT_EQ(ex.config().layers[0].k_cache, w.k[0].data());
  for (const auto& lens : steps) {
    w.set_lens(lens);
    w.fill_step(ex);
    EXPECT_FALSE(ex.step(w.inputs()).captured);
    EXPECT_TRUE(w.check_layer(ex, 0)) << "still the old caches";
    EXPECT_TRUE(w.check_layer(ex, 1));
  }
}

// A re-capture that fails (the step body throws, or the capture itself) changes nothing either.
TEST(RebindLayers, AFailedRecaptureChangesNothing) {
  World w(spec(), 1, 4, 2048, 101);
  bool fail = false;
  Executor ex(w.config(4, 2048), [&](StepContext& ctx) {
    ctx.append_kv(0);
    ctx.attention(0);
    if (fail && ctx.plan().band_hi > 1024) throw std::runtime_error("caller failure during a re-capture");
  });
  const auto steps = capture_two(w, ex);
  Caches fresh(w, w.rng);
  fail = true;
  EXPECT_THROW(ex.rebind_layers(fresh.layers()), std::runtime_error);
  fail = false;
  {
    fault::ScopedFault f(fault::Site::kCaptureEnd, 1);  // the second graph's capture fails
    EXPECT_THROW(ex.rebind_layers(fresh.layers()), CudaError);
  }
  EXPECT_EQ(ex.stats().graph_updates, 0);
  EXPECT_EQ(ex.config().layers[0].k_cache, w.k[0].data());
  for (const auto& lens : steps) {
    w.set_lens(lens);
    w.fill_step(ex);
    EXPECT_FALSE(ex.step(w.inputs()).captured);
    EXPECT_TRUE(w.check_layer(ex, 0)) << "still the old caches";
  }
  ex.rebind_layers(fresh.layers());  // and then it works
  fresh.swap_into(w);
  w.set_lens(steps[0]);
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_EQ(ex.stats().graph_updates, 2);
}

// An update whose re-instantiation fails too leaves the new buffers in effect and drops that graph;
// the next step that needs it captures it again, over the new caches.
TEST(RebindLayers, AGraphThatCannotBeUpdatedIsDroppedAndCapturedAgain) {
  World w(spec(), 1, 4, 2048, 103);
  Executor ex(w.config(4, 2048));
  const auto steps = capture_two(w, ex);
  Caches fresh(w, w.rng);
  fault::arm(fault::Site::kGraphUpdate);
  fault::arm(fault::Site::kInstantiate);
  EXPECT_THROW(ex.rebind_layers(fresh.layers()), CudaError);
  fault::disarm_all();
  fresh.swap_into(w);
  EXPECT_EQ(ex.config().layers[0].k_cache, w.k[0].data());
  std::vector<bool> captured;
  for (const auto& lens : steps) {
    w.set_lens(lens);
    w.fill_step(ex);
    captured.push_back(ex.step(w.inputs()).captured);
    EXPECT_TRUE(w.check_layer(ex, 0)) << "the new caches, whether updated or captured again";
  }
  EXPECT_EQ(std::count(captured.begin(), captured.end(), true), 1) << "only the graph whose update failed";
  EXPECT_EQ(ex.stats().graph_updates, 1);
  EXPECT_EQ(ex.stats().total_captures, 3);
}

// Layer buffers move between the caller and the executor across rebinds.
TEST(RebindLayers, OwnedBuffersComeBackWhenTheCallerStopsGivingThem) {
  World w(spec(), 1, 4, 1024, 107);
  Executor ex(w.config(4, 1024));
  void* const owned_q = ex.query(0);
  w.set_lens({10, 600});
  w.fill_step(ex);
  ex.step(w.inputs());
  dgtest::Buffer q = dgtest::make_buffer(w.spec.dtype, w.q_elems(4));
  std::vector<LayerBuffers> layers = {LayerBuffers{w.k[0].data(), w.v[0].data(), q.data()}};
  ex.rebind_layers(layers);
  EXPECT_EQ(ex.query(0), q.data());
  w.fill_step(ex);  // writes the caller's q now
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
  layers[0].q = nullptr;
  const std::size_t static_before = ex.memory().static_buffers;
  ex.rebind_layers(layers);
  EXPECT_EQ(ex.query(0), owned_q) << "the executor's own buffer is reused";
  EXPECT_EQ(ex.memory().static_buffers, static_before);
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
}

// ---------------------------------------------------------------- block ids kCheap does not check

/// The world's table with bad ids clamped as the kernels clamp them (attention.hpp).
std::vector<int32_t> clamped(const World& w) {
  std::vector<int32_t> t = w.tables;
  for (int32_t& id : t) id = id < 0 ? 0 : (id >= w.num_blocks ? w.num_blocks - 1 : id);
  return t;
}

class BadBlock : public ::testing::TestWithParam<KernelKind> {};

TEST_P(BadBlock, KCheapClampsTheIdAndTheNextStepReportsIt) {
  World w(spec(DType::kBFloat16), 2, 8, 2048, 109);
  ExecutorConfig c = w.config(8, 2048);
  c.validation = ValidationLevel::kCheap;
  c.v2_threshold = 1024;
  c.policy = KernelPolicy::kThreshold;
  c.append_kv = false;
  Executor ex(c);
  const int len = GetParam() == KernelKind::kV1 ? 900 : 1800;
  w.set_lens({len, 300, len - 17});
  w.tables[2 * w.stride + 3] = w.num_blocks + 5;  // sequence 2, column 3
  w.tables[2 * w.stride + 9] = -4;                // a second bad id in the same row: not the first
  w.fill_step(ex);
  const StepResult r = ex.step(w.inputs());  // runs: kCheap does not read block ids
  EXPECT_EQ(r.kernel, GetParam());
  // Never outside the cache: the bad ids read clamped blocks, so sequence 2's output is what the
  // reference gives over the clamped table, and the other rows are right.
  const std::vector<int32_t> t = clamped(w);
  for (int l = 0; l < 2; ++l)
    EXPECT_TRUE(check_rows(w, ex.output(l), 0, reference(w, l, ex.query(l), 0, &t))) << "layer " << l;

  w.set_lens({50, 60});  // a good step: rejected once, for the previous step's bad id
  w.fill_step(ex);
  EXPECT_TRUE(rejects([&] { ex.step(w.inputs()); },
                      {"inputs.block_tables[2][3]", "0..num_blocks-1 = 0.." + std::to_string(w.num_blocks - 1),
                       "step 1", "sequence 2", "submit its inputs again"}));
  EXPECT_EQ(ex.stats().bad_block_reports, 1);
  EXPECT_EQ(ex.stats().rejected_steps, 1);
  ex.step(w.inputs());  // then it runs
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_TRUE(w.check_layer(ex, 1));
  EXPECT_NO_THROW(ex.check_errors());
  EXPECT_EQ(ex.stats().bad_block_reports, 1);
}

INSTANTIATE_TEST_SUITE_P(Host, BadBlock, ::testing::Values(KernelKind::kV1, KernelKind::kV2),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(BadBlockReport, CheckErrorsReportsItAndClearsIt) {
  World w(spec(), 1, 4, 1024, 113);
  ExecutorConfig c = w.config(4, 1024);
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  w.set_lens({10, 20});
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_NO_THROW(ex.check_errors());
  w.set_lens({100, 20, 40});
  w.tables[1 * w.stride + 1] = -1;  // sequence 1 has 20 tokens: columns 0 and 1 are read
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(rejects([&] { ex.check_errors(); }, {"inputs.block_tables[1][1]", "sequence 1, step 2)"}));
  EXPECT_NO_THROW(ex.check_errors()) << "reported once";
  w.tables[1 * w.stride + 1] = w.seq_blocks[1][1];
  w.tables[1 * w.stride + 2] = -1;  // past sequence 1's length: never read, never reported
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_NO_THROW(ex.check_errors());
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_EQ(ex.stats().bad_block_reports, 1);
  EXPECT_EQ(ex.stats().rejected_steps, 0) << "check_errors() is not a step";
}

// Without check_errors() the report names the steps since the last report: the flag is read when the
// next step starts, without waiting for the device, so it cannot tell which of them it was.
TEST(BadBlockReport, TheReportNamesTheStepsSinceTheLastOne) {
  World w(spec(), 1, 4, 1024, 127);
  ExecutorConfig c = w.config(4, 1024);
  c.validation = ValidationLevel::kCheap;
  Executor ex(c);
  w.set_lens({300, 20});
  for (int k = 0; k < 2; ++k) {
    w.fill_step(ex);
    ex.step(w.inputs());
  }
  w.tables[0 * w.stride + 18] = w.num_blocks;  // sequence 0, column 18 of 19
  ex.step(w.inputs());
  w.set_lens({300, 20});
  EXPECT_TRUE(rejects([&] { ex.step(w.inputs()); },
                      {"inputs.block_tables[0][18]", "one of steps 1..3 (those since the last report)"}));
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_EQ(ex.stats().steps, 4);
  EXPECT_EQ(ex.stats().rejected_steps, 1);
}

}  // namespace
