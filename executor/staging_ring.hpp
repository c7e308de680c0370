// The pinned host mirrors in front of the staged inputs (internal), kStagingSlots of them: host
// inputs are copied into a slot (or written there through host_staging()) and DMA'd from it on the
// step's stream. A slot is written again only once the copies that last read it are done, so the
// host can stage step n + 1 while step n's copies (queued behind everything on a caller's stream)
// are still pending; before the ring, every step waited for the previous step's copies.
//
// Which slot the next step uses (picked once, by host_staging() or by the step, whichever comes
// first): the last step's slot if its copies are done already (no wait, and its lines are still in
// the CPU's cache: rotating through three slots of a 2 MiB block table would triple the working
// set), else another slot whose copies are done, else the one released longest ago (wait for it).
// A step whose inputs are in a slot (exactly as handed out) stages through that slot instead.
// Synthetic staging (kMeasured) uses a slot that is neither the last step's nor the next one's, so
// it never touches inputs the caller wrote for the step being run or handed out for the next.
#pragma once

#include <cstddef>
#include <cstdint>

#include "decodegraph/executor.hpp"
#include "executor/backend.hpp"
#include "executor/memory.hpp"

namespace decodegraph::detail {

class StagingRing {
 public:
  struct Slot {
    int32_t* seq_lens = nullptr;      // [max_batch]
    int32_t* block_tables = nullptr;  // [max_batch, max_blocks_per_seq]
    int64_t* slot_mapping = nullptr;  // [max_batch * max q_len]
  };

  StagingRing(const ExecutorConfig& config, Backend& backend, Allocations& memory);

  /// host_staging(): the next step's slot (picked as the file comment says), once the copies that
  /// last read it are done.
  HostStaging hand_out();
  /// Checks the inputs' pointers into the ring: each outside every slot, or exactly a slot's buffer
  /// as handed out (host space; the table at the staging stride), all in one slot. Returns that
  /// slot, or -1 when no input is in the ring. Throws InvalidArgument.
  int slot_of(const StepInputs& in) const;
  /// The slot a host-input step stages through (`inputs_slot`, else the next), once it is reusable.
  int acquire_for_step(int inputs_slot);
  /// A slot that is neither the last step's nor the next step's, for synthetic staging, once it is reusable.
  int acquire_spare();
  /// The copies from `slot` are enqueued: marks them (Backend::staging_done). After a step's slot
  /// the next step's slot is picked afresh.
  void release(int slot, bool step);

  const Slot& operator[](int slot) const { return slots_[slot]; }
  std::size_t table_bytes() const;

 private:
  const ExecutorConfig& cfg_;
  Backend& backend_;
  /// The next step's slot, picked on first use after a step.
  int pick();

  Slot slots_[kStagingSlots];
  char* base_ = nullptr;  // every slot's buffers, in one pinned allocation
  std::size_t ring_bytes_ = 0;
  std::size_t per_slot_ = 0;  // bytes from one slot's buffers to the next's
  long long released_[kStagingSlots] = {};  // when each slot's copies were last enqueued (0: never)
  long long releases_ = 0;
  int next_ = 0;         // the next step's slot, once picked
  bool picked_ = false;
  int last_ = -1;        // the last step's slot
};

/// Host backend, for tests: while set (on this thread), the host backend reports every slot's
/// copies as still in flight (Backend::staging_reusable_now false), as a device running behind would.
void set_host_staging_copies_pending(bool pending);
bool host_staging_copies_pending();

}  // namespace decodegraph::detail
