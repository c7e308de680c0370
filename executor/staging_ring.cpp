// The pinned staging ring (staging_ring.hpp).
#include "executor/staging_ring.hpp"

#include <algorithm>
#include <string>

#include "decodegraph/error.hpp"
#include "executor/config_checks.hpp"
#include "executor/log.hpp"

namespace decodegraph::detail {
namespace {

/// True when [p, p + n) overlaps [base, base + bytes).
bool overlaps(const void* p, std::size_t n, const void* base, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(base);
  return a < b + bytes && b < a + std::max<std::size_t>(n, 1);
}

}  // namespace

// One allocation for every slot, so that inputs outside the ring (the common case) are told apart
// with two compares per pointer (slot_of).
StagingRing::StagingRing(const ExecutorConfig& config, Backend& backend, Allocations& memory)
    : cfg_(config), backend_(backend) {
  const std::size_t mb = static_cast<std::size_t>(cfg_.max_batch);
  auto aligned = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };  // each buffer 256-byte aligned
  const std::size_t lens = aligned(mb * sizeof(int32_t)), slots = aligned(max_rows(cfg_) * sizeof(int64_t));
  const std::size_t per_slot = lens + slots + aligned(table_bytes());
  per_slot_ = per_slot;
  ring_bytes_ = per_slot * kStagingSlots;
  base_ = static_cast<char*>(memory.host(ring_bytes_));
  for (int k = 0; k < kStagingSlots; ++k) {
    char* p = base_ + k * per_slot;
    slots_[k].seq_lens = reinterpret_cast<int32_t*>(p);
    slots_[k].slot_mapping = reinterpret_cast<int64_t*>(p + lens);
    slots_[k].block_tables = reinterpret_cast<int32_t*>(p + lens + slots);
  }
}

std::size_t StagingRing::table_bytes() const {
  return static_cast<std::size_t>(cfg_.max_batch) * cfg_.max_blocks_per_seq * sizeof(int32_t);
}

int StagingRing::pick() {
  if (picked_) return next_;
  int slot = -1;
  if (last_ < 0) {
    slot = 0;
  } else {
    for (int d = 0; d < kStagingSlots && slot < 0; ++d) {
      const int k = (last_ + d) % kStagingSlots;
      if (backend_.staging_reusable_now(k)) slot = k;
    }
    if (slot < 0) {  // every slot's copies in flight: wait for the oldest other than the last step's
      for (int k = 0; k < kStagingSlots; ++k)
        if (k != last_ && (slot < 0 || released_[k] < released_[slot])) slot = k;
    }
  }
  next_ = slot;
  picked_ = true;
  return slot;
}

HostStaging StagingRing::hand_out() {
  const int slot = pick();
  backend_.wait_staging_reusable(slot);
  const Slot& s = slots_[slot];
  const std::size_t mb = static_cast<std::size_t>(cfg_.max_batch);
  HostStaging h;
  h.seq_lens = std::span<int32_t>(s.seq_lens, mb);
  h.block_tables = std::span<int32_t>(s.block_tables, mb * cfg_.max_blocks_per_seq);
  h.block_table_stride = cfg_.max_blocks_per_seq;
  h.slot_mapping = std::span<int64_t>(s.slot_mapping, max_rows(cfg_));
  return h;
}

// Anything overlapping a slot other than at its start would be copied onto itself, and inputs split
// over two slots would make one of them the step's while the other may be rewritten under it. The
// slots are one allocation: a pointer outside it costs two compares, one inside it a division.
int StagingRing::slot_of(const StepInputs& in) const {
  const std::size_t n = static_cast<std::size_t>(in.num_seqs);
  const std::size_t rows = in.block_table_stride > 0 ? n * static_cast<std::size_t>(in.block_table_stride) : n;
  int found = -1;
  const char* found_name = nullptr;
  // `start`: where this buffer begins within a slot.
  auto check = [&](const void* p, std::size_t bytes, std::size_t start, const char* name) {
    if (!overlaps(p, bytes, base_, ring_bytes_)) return;
    const auto addr = reinterpret_cast<std::uintptr_t>(p), base = reinterpret_cast<std::uintptr_t>(base_);
    const int k = addr >= base ? static_cast<int>((addr - base) / per_slot_) : -1;
    if (k < 0 || addr != base + k * per_slot_ + start)
      throw_invalid(std::string("inputs.") + name, ptr_text(p),
                    std::string("a buffer outside the host staging buffers, or exactly host_staging().") + name);
    if (found >= 0 && found != k)
      throw_invalid(std::string("inputs.") + name, ptr_text(p),
                    std::string("host_staging().") + name + " of the same host_staging() call as inputs." + found_name +
                        " (the staging buffers come in several sets; each call hands out the next step's)");
    found = k;
    found_name = name;
  };
  const auto offset = [&](const void* p) {
    return static_cast<std::size_t>(static_cast<const char*>(p) - base_);
  };
  check(in.seq_lens, n * sizeof(int32_t), offset(slots_[0].seq_lens), "seq_lens");
  const std::size_t q = static_cast<std::size_t>(std::max(1, in.q_len));
  check(in.slot_mapping, n * q * sizeof(int64_t), offset(slots_[0].slot_mapping), "slot_mapping");
  check(in.block_tables, rows * sizeof(int32_t), offset(slots_[0].block_tables), "block_tables");
  if (found >= 0 && in.space != MemorySpace::kHost)
    throw_invalid("inputs.space", "kDevice", "kHost for inputs in the host staging buffers");
  if (found >= 0 && in.block_tables == slots_[found].block_tables && in.block_table_stride != cfg_.max_blocks_per_seq)
    throw_invalid("inputs.block_table_stride", in.block_table_stride,
                  "host_staging().block_table_stride = " + std::to_string(cfg_.max_blocks_per_seq) +
                      " for block_tables in the host staging buffer");
  return found;
}

int StagingRing::acquire_for_step(int inputs_slot) {
  const int slot = inputs_slot >= 0 ? inputs_slot : pick();
  backend_.wait_staging_reusable(slot);
  return slot;
}

int StagingRing::acquire_spare() {
  const int next = pick();  // fixed now, so the spare cannot become the next step's slot
  int slot = -1;
  for (int k = 0; k < kStagingSlots; ++k) {
    if (k == next || k == last_) continue;
    if (slot < 0 || released_[k] < released_[slot]) slot = k;  // kStagingSlots >= 3: one is always left
  }
  backend_.wait_staging_reusable(slot);
  return slot;
}

void StagingRing::release(int slot, bool step) {
  backend_.staging_done(slot);
  released_[slot] = ++releases_;
  if (!step) return;
  last_ = slot;
  picked_ = false;
}

namespace {
thread_local bool t_host_copies_pending = false;
}  // namespace
void set_host_staging_copies_pending(bool pending) { t_host_copies_pending = pending; }
bool host_staging_copies_pending() { return t_host_copies_pending; }

static_assert(kStagingSlots >= 3, "the spare slot must differ from the last step's and the next one's");

}  // namespace decodegraph::detail
