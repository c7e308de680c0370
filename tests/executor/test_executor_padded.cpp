// Padded rows the caller passes (issue 36): seq_len 0 with slot -1 inside num_seqs, as vLLM pads a
// graph batch. Executor::step accepts them as the eager calls do: their output rows are left
// untouched and they append nothing, while the live rows around them match the float64 reference
// and append bitwise. Across both band choices (kHost, kDevice), V1 and V2 bands, q_len 1 and 4,
// kCheap and kFull, host and "device" (on the host backend: host memory passed as kDevice) inputs.
// A padded row with a slot that is not negative is rejected, naming the slot and the row.
// The CUDA backend's side runs in test_executor_gpu.cpp (ExecutorGpu.PaddedRows...).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"

namespace {
using namespace decodegraph;
using dgtest::World;

// Every element of rows [from, to) of a layer's output is still the NaN poison.
bool rows_untouched(const AttentionSpec& s, const void* out, int from, int to) {
  const std::size_t row = static_cast<std::size_t>(s.num_q_heads) * s.head_size;
  for (std::size_t i = from * row; i < to * row; ++i)
    if (!std::isnan(load_as_float(s.dtype, out, i))) return false;
  return true;
}

bool has_nan(const AttentionSpec& s, const dgtest::Buffer& cache) {
  const std::size_t n = cache.bytes / dtype_size(s.dtype);
  for (std::size_t i = 0; i < n; ++i)
    if (std::isnan(load_as_float(s.dtype, cache.data(), i))) return true;
  return false;
}

// band select, q_len, V2 (lengths above the threshold), kFull, device-space inputs
using Param = std::tuple<BandSelect, int, bool, bool, bool>;
class PaddedRows : public ::testing::TestWithParam<Param> {};

TEST_P(PaddedRows, LeaveTheirOutputUntouchedAndAppendNothing) {
  const auto [band, q_len, v2, full, device] = GetParam();
  const AttentionSpec s = dgtest::small_spec(DType::kBFloat16);
  World w(s, 2, 8, 2048, 36);
  ExecutorConfig c = w.config(8, 2048);
  c.band_select = band;
  c.q_lens = {1, 4};
  c.policy = KernelPolicy::kThreshold;
  c.v2_threshold = 512;
  c.partition_size = 256;
  c.validation = full ? ValidationLevel::kFull : ValidationLevel::kCheap;
  Executor ex(c);
  const int lo = v2 ? 600 : 4, hi = v2 ? 2000 : 500;
  // Rows 1 and 4 are padded; the step's batch bucket (8) pads rows 6 and 7 itself.
  const std::vector<int> lens = {lo, 0, hi, (lo + hi) / 2, 0, lo + 3};
  const std::vector<bool> live = {true, false, true, true, false, true};
  w.set_lens(lens, q_len);
  for (std::size_t i = 0; i < lens.size(); ++i)
    if (!live[i])
      for (int j = 0; j < q_len; ++j) w.slots[i * q_len + j] = -1;
  for (int step = 0; step < 2; ++step) {  // captured, then replayed
    w.fill_step(ex);
    for (int l = 0; l < w.num_layers; ++l) {
      dgtest::poison(s.dtype, ex.output(l), w.q_elems(8 * 4, l));
      // The padded rows' new K/V are NaN: appending one would leave a NaN in the cache.
      for (std::size_t i = 0; i < lens.size(); ++i)
        if (!live[i]) {
          const std::size_t kv_row = w.kv_elems(1, l) * dtype_size(s.dtype);
          std::memset(static_cast<char*>(ex.new_key(l)) + i * q_len * kv_row, 0xff, q_len * kv_row);
          std::memset(static_cast<char*>(ex.new_value(l)) + i * q_len * kv_row, 0xff, q_len * kv_row);
        }
    }
    StepInputs in = w.inputs();
    if (device) in.space = MemorySpace::kDevice;
    const StepResult r = ex.step(in);
    EXPECT_EQ(r.bucket_batch_size, 8);
    EXPECT_EQ(r.kernel, v2 && r.band >= 0 ? KernelKind::kV2 : KernelKind::kV1);
    for (int l = 0; l < w.num_layers; ++l) {
      const std::vector<double> ref = w.reference(l, ex.query(l));
      std::vector<bool> mask;  // one entry per row: live sequences' rows
      for (bool b : live) mask.insert(mask.end(), q_len, b);
      const dgtest::Tol t = dgtest::tol_for(s.dtype);
      EXPECT_TRUE(dgtest::check_close(s.dtype, ex.output(l), ref.data(), w.rows(), s.num_q_heads, s.head_size, t.atol,
                                      t.rtol, mask))
          << "layer " << l << " step " << step;
      for (std::size_t i = 0; i < lens.size(); ++i)
        if (!live[i])
          EXPECT_TRUE(rows_untouched(s, ex.output(l), static_cast<int>(i) * q_len, static_cast<int>(i + 1) * q_len))
              << "padded row " << i << " layer " << l << ": output written";
      EXPECT_TRUE(rows_untouched(s, ex.output(l), w.rows(), 8 * q_len)) << "the bucket's own padding";
      EXPECT_TRUE(w.check_appended(ex, l)) << "layer " << l;
      EXPECT_FALSE(has_nan(s, w.k[l]) || has_nan(s, w.v[l])) << "layer " << l << ": a padded row was appended";
    }
  }
  EXPECT_EQ(ex.stats().rejected_steps, 0);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [band, q, v2, full, device] = info.param;
  return std::string(band == BandSelect::kHost ? "BandHost" : "BandDevice") + "_QLen" + std::to_string(q) +
         (v2 ? "_V2" : "_V1") + (full ? "_Full" : "_Cheap") + (device ? "_DeviceInputs" : "_HostInputs");
}

INSTANTIATE_TEST_SUITE_P(Host, PaddedRows,
                         ::testing::Combine(::testing::Values(BandSelect::kHost, BandSelect::kDevice),
                                            ::testing::Values(1, 4), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()),
                         param_name);

TEST(PaddedRowsBadInput, ASlotOnAPaddedRowIsRejectedNamingIt) {
  const AttentionSpec s = dgtest::small_spec();
  World w(s, 1, 4, 512, 5);
  for (ValidationLevel level : {ValidationLevel::kCheap, ValidationLevel::kFull}) {
    ExecutorConfig c = w.config(4, 512);
    c.validation = level;
    c.q_lens = {1, 4};
    Executor ex(c);
    w.set_lens({40, 0, 9}, 4);
    for (int j = 0; j < 4; ++j) w.slots[4 + j] = -1;
    w.slots[6] = 77;  // token 2 of the padded row 1
    EXPECT_TRUE(dgtest::rejects([&] { ex.step(w.inputs()); },
                                {"inputs.slot_mapping[6] = 77", "seq_lens[1] = 0 marks a padded row", "live rows only"}));
    EXPECT_EQ(ex.stats().rejected_steps, 1);
    w.slots[6] = -1;
    w.fill_step(ex);
    ex.step(w.inputs());
    EXPECT_TRUE(w.check_appended(ex, 0));
  }
}

TEST(PaddedRowsBadInput, NegativeLengthsAreStillRejected) {
  World w(dgtest::small_spec(), 1, 4, 512, 6);
  Executor ex(w.config(4, 512));
  w.set_lens({40, 9});
  w.lens[1] = -1;
  EXPECT_TRUE(dgtest::rejects([&] { ex.step(w.inputs()); },
                              {"inputs.seq_lens[1] = -1", "0 (a padded row) or 1..max_seq_len = 1..512"}));
}

}  // namespace
