// Input validation and staging (internal): what step() checks about a StepInputs, and the copy of
// its lengths, block tables and slots into the static buffers every graph reads.
//
// NOTE(graph): the staged buffers are executor memory at fixed addresses, bound into every captured
// launch; what changes between steps is written into them here, never baked into a launch. The
// pinned host mirrors in front of them (a ring of slots, staging_ring.hpp) are what host_staging()
// hands out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "decodegraph/executor.hpp"
#include "executor/backend.hpp"
#include "executor/memory.hpp"
#include "executor/staging_ring.hpp"

namespace decodegraph::detail {

/// What validate() learnt about the lengths: band_len sizes the band (kHost) and the staged table
/// columns (0: not known, device inputs under kDevice without a hint); max_len is the longest
/// length when the lengths were read on the host, else 0.
struct Lengths {
  int band_len = 0;
  int max_len = 0;
};

/// Device addresses of the staged inputs (executor memory, fixed for the executor's lifetime).
struct StagedInputs {
  int32_t* seq_lens = nullptr;      // [max_batch]
  int32_t* block_tables = nullptr;  // [max_batch, max_blocks_per_seq]
  int64_t* slot_mapping = nullptr;  // [max_batch, max q_len]: a step's [batch, q_len] (padded: -1)
};

class StepStaging {
 public:
  /// Device bytes the constructor allocates for `config` (for the budget, before allocating).
  static std::size_t device_bytes(const ExecutorConfig& config);
  /// `band_mode`: the band choice in effect; under kDevice device-resident lengths need not be read.
  StepStaging(const ExecutorConfig& config, BandSelect band_mode, Backend& backend, Allocations& memory);

  /// Checks the inputs (docs/bad-input.md) and returns what it learnt about the lengths: the
  /// max_seq_len hint when given, else the largest seq_len. A length 0 is a padded row (its slots,
  /// where read, must be negative); every other is q_len..max_seq_len. Host inputs: every length is checked
  /// (and against the hint). Device-resident inputs without a hint are copied to the host under
  /// kHost (num_seqs * 4 bytes, synchronously on the step's stream) to find the band; with one,
  /// or under kDevice, nothing is read back under kCheap. kFull copies and checks everything:
  /// lengths (against the hint too), every block id a length uses, and every slot (range, and the
  /// position of its token: seq_len - q_len + j for column j). The step's q_len must be one of the
  /// config's and every length read at least it. Throws InvalidArgument; nothing is staged.
  Lengths validate(const StepInputs& in);
  /// Copies the inputs into the static buffers for a bucket of `batch` rows. Rows [num_seqs,
  /// batch) get seq_len 0 and their q_len slots -1. Only the block-table columns band_len needs are copied (0:
  /// every column the rows may use): the kernels never read past a row's length, clamped to the
  /// band. Host inputs go through the pinned mirrors, unless they were written there already
  /// (host_staging()): then only the DMA remains.
  void stage(const StepInputs& in, int batch, int band_len);
  /// Stages a step of plan.batch sequences in the middle of the plan's band, each over valid block
  /// ids, and no slots: what kMeasured times where no real step is staged for the band. Through the
  /// ring's spare slot, so the mirrors holding the caller's inputs (written through host_staging())
  /// for the step being run, or handed out for the next one, are left alone.
  /// Its lengths are at least plan.q_len.
  void stage_synthetic(const BucketPlan& plan);
  /// The next slot of pinned mirrors, once the copies that last read it have (StagingRing::hand_out).
  HostStaging host_staging();

  const StagedInputs& device() const { return dev_; }
  long long input_downloads() const { return input_downloads_; }
  long long copy_bytes() const { return staging_copy_bytes_; }

 private:
  int check_lengths(const StepInputs& in, const int32_t* lens) const;
  void check_tables_and_slots(const StepInputs& in, const int32_t* lens);
  void check_padded_slots(const StepInputs& in, const int32_t* lens, const int64_t* slots) const;
  void stage_inputs(const StepInputs& in, int batch, int band_len, bool synthetic);
  void stage_host(const StepInputs& in, int batch, std::size_t cols, const StagingRing::Slot& m);
  std::size_t mirror_table_bytes() const;

  const ExecutorConfig& cfg_;
  const int widest_window_;  // kFull checks the entries some layer reads (widest_window)
  const BandSelect band_mode_;
  Backend& backend_;
  StagedInputs dev_;
  // Pinned host mirrors (plain host memory on the host backend).
  StagingRing ring_;
  // Scratch for validating device-resident inputs.
  std::vector<int32_t> seq_scratch_, bt_scratch_;
  std::vector<int64_t> slot_scratch_;
  long long input_downloads_ = 0;
  long long staging_copy_bytes_ = 0;
};

}  // namespace decodegraph::detail
