// The staging seam (executor/staging.hpp) on its own, through the host backend: what validate()
// learns and reads back, what stage() writes into the static buffers (padding, the columns it
// copies, the host mirrors), and that synthetic staging leaves the caller's mirrors alone. The
// executor tests cover the same behaviour end to end; these pin it where it is implemented.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "decodegraph/error.hpp"
#include "executor/backend.hpp"
#include "executor/config_checks.hpp"
#include "executor/memory.hpp"
#include "executor/staging.hpp"
#include "test_util.hpp"

namespace {

using namespace decodegraph;
using detail::Lengths;
using detail::StepStaging;

struct StagingRig {
  std::unique_ptr<detail::Backend> backend = detail::make_host_backend();
  detail::Allocations memory{*backend};
  ExecutorConfig cfg;
  std::vector<int32_t> lens, tables;
  std::vector<int64_t> slots;
  int stride = 0;

  explicit StagingRig(ValidationLevel level = ValidationLevel::kCheap) {
    cfg.spec = {4, 2, 64, 16, DType::kFloat32, KVLayout::kNHD};
    cfg.max_batch = 8;
    cfg.max_seq_len = 1000;
    cfg.num_blocks = 600;
    cfg.validation = level;
    cfg.max_blocks_per_seq = (cfg.max_seq_len + 15) / 16;  // 63
    cfg = detail::resolve_planning(cfg);
  }
  /// `n` sequences of the given lengths over distinct blocks, the caller's table `extra` columns wider.
  StepInputs inputs(const std::vector<int32_t>& l, int extra = 5) {
    lens = l;
    const int n = static_cast<int>(l.size());
    stride = cfg.max_blocks_per_seq + extra;
    tables.assign(static_cast<std::size_t>(n) * stride, -7);  // columns past a length: garbage
    slots.assign(n, 0);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < (l[i] + 15) / 16; ++j) tables[i * stride + j] = i * 63 + j;
      const int pos = l[i] - 1;
      slots[i] = static_cast<int64_t>(tables[i * stride + pos / 16]) * 16 + pos % 16;
    }
    StepInputs in;
    in.num_seqs = n;
    in.seq_lens = lens.data();
    in.block_tables = tables.data();
    in.block_table_stride = stride;
    in.slot_mapping = slots.data();
    return in;
  }
};

TEST(Staging, HostInputsAreReadAndPaddedRowsStagedEmpty) {
  StagingRig r;
  StepStaging s(r.cfg, BandSelect::kHost, *r.backend, r.memory);
  const StepInputs in = r.inputs({17, 300, 1});
  const Lengths lens = s.validate(in);
  EXPECT_EQ(lens.max_len, 300);
  EXPECT_EQ(lens.band_len, 300);
  s.stage(in, /*batch=*/4, lens.band_len);
  const detail::StagedInputs& d = s.device();  // host memory on the host backend
  EXPECT_EQ(std::vector<int32_t>(d.seq_lens, d.seq_lens + 4), (std::vector<int32_t>{17, 300, 1, 0}));
  EXPECT_EQ(d.slot_mapping[3], -1) << "a padded row must skip its append";
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(d.slot_mapping[i], r.slots[i]) << "row " << i;
  // Only the columns 300 tokens need (19) are copied; the rest of the staged row keeps its zeros.
  const int32_t* row1 = d.block_tables + r.cfg.max_blocks_per_seq;
  for (int j = 0; j < 19; ++j) EXPECT_EQ(row1[j], 63 + j) << "column " << j;
  EXPECT_EQ(row1[19], 0) << "a column past band_len was staged";
  EXPECT_EQ(s.input_downloads(), 0);
  EXPECT_EQ(s.copy_bytes(), static_cast<long long>(3 * 4 + 3 * 8 + 3 * 19 * 4));
}

TEST(Staging, TheHintSetsTheBandAndIsCheckedAgainstHostLengths) {
  StagingRig r;
  StepStaging s(r.cfg, BandSelect::kHost, *r.backend, r.memory);
  StepInputs in = r.inputs({40, 60});
  in.max_seq_len = 500;
  EXPECT_EQ(s.validate(in).band_len, 500);
  in.max_seq_len = 50;  // below a length
  dgtest::expect_error([&] { s.validate(in); }, {"inputs.max_seq_len", "seq_lens[1] = 60"});
}

TEST(Staging, DeviceInputsAreReadBackOnlyWhenTheBandNeedsThem) {
  StagingRig r;
  StepInputs in = r.inputs({40, 900});
  in.space = MemorySpace::kDevice;  // host memory stands in for device memory on the host backend
  StepStaging host_band(r.cfg, BandSelect::kHost, *r.backend, r.memory);
  EXPECT_EQ(host_band.validate(in).band_len, 900);
  EXPECT_EQ(host_band.input_downloads(), 1) << "kHost needs the longest length to find the band";
  in.max_seq_len = 950;
  EXPECT_EQ(host_band.validate(in).band_len, 950);
  EXPECT_EQ(host_band.input_downloads(), 1) << "with a hint nothing is read back";

  StepStaging device_band(r.cfg, BandSelect::kDevice, *r.backend, r.memory);
  in.max_seq_len = 0;
  const Lengths lens = device_band.validate(in);
  EXPECT_EQ(lens.band_len, 0) << "under kDevice the graph finds the band";
  EXPECT_EQ(lens.max_len, 0);
  EXPECT_EQ(device_band.input_downloads(), 0);
  // Unknown lengths: every column the caller's table has, up to the staged width.
  device_band.stage(in, 2, lens.band_len);
  const int32_t* row1 = device_band.device().block_tables + r.cfg.max_blocks_per_seq;
  EXPECT_EQ(row1[r.cfg.max_blocks_per_seq - 1], r.tables[r.stride + r.cfg.max_blocks_per_seq - 1]);
}

TEST(Staging, FullValidationNamesTheSlotOfTheWrongPosition) {
  StagingRig r(ValidationLevel::kFull);
  StepStaging s(r.cfg, BandSelect::kHost, *r.backend, r.memory);
  StepInputs in = r.inputs({33, 7});
  r.slots[0] += 1;  // the slot of position seq_len instead of seq_len - 1
  dgtest::expect_error([&] { s.validate(in); }, {"inputs.slot_mapping[0]", "position seq_len - 1 = 32"});
}

TEST(Staging, InputsWrittenIntoHostStagingAreNotCopiedAndSyntheticStagingKeepsThem) {
  StagingRig r;
  StepStaging s(r.cfg, BandSelect::kHost, *r.backend, r.memory);
  HostStaging h = s.host_staging();
  const StepInputs src = r.inputs({100, 20});
  std::copy(r.lens.begin(), r.lens.end(), h.seq_lens.begin());
  std::copy(r.slots.begin(), r.slots.end(), h.slot_mapping.begin());
  for (int i = 0; i < 2; ++i)
    std::memcpy(&h.block_tables[i * h.block_table_stride], &r.tables[i * r.stride], 7 * sizeof(int32_t));
  StepInputs in = src;
  in.seq_lens = h.seq_lens.data();
  in.slot_mapping = h.slot_mapping.data();
  in.block_tables = h.block_tables.data();
  in.block_table_stride = h.block_table_stride;

  BucketPlan synthetic;
  synthetic.batch = 8;
  synthetic.band_lo = 512;
  synthetic.band_hi = 1000;
  s.stage_synthetic(synthetic);  // kMeasured before the step: must not touch the caller's mirrors
  EXPECT_EQ(s.device().seq_lens[0], 756) << "the middle of (512, 1000]: 512 + (1000 - 512 + 1) / 2";
  EXPECT_EQ(h.seq_lens[0], 100);
  EXPECT_EQ(h.slot_mapping[1], r.slots[1]);

  s.stage(in, 2, s.validate(in).band_len);
  EXPECT_EQ(s.copy_bytes(), 0) << "inputs already in the mirrors are DMA'd as they are";
  EXPECT_EQ(s.device().seq_lens[0], 100);
  EXPECT_EQ(s.device().block_tables[r.cfg.max_blocks_per_seq + 1], r.tables[r.stride + 1]);

  StepInputs shifted = in;
  shifted.seq_lens = h.seq_lens.data() + 1;  // overlapping the mirror, not at its start
  EXPECT_THROW(s.validate(shifted), InvalidArgument);
}

}  // namespace
