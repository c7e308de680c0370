// Input validation and staging (staging.hpp).
#include "executor/staging.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "decodegraph/error.hpp"
#include "executor/config_checks.hpp"
#include "executor/layer_groups.hpp"
#include "executor/log.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/validate.hpp"

namespace decodegraph::detail {
std::size_t StepStaging::device_bytes(const ExecutorConfig& c) {
  const std::size_t mb = static_cast<std::size_t>(c.max_batch);
  return mb * sizeof(int32_t) + mb * c.max_blocks_per_seq * sizeof(int32_t) + max_rows(c) * sizeof(int64_t);
}

StepStaging::StepStaging(const ExecutorConfig& config, BandSelect band_mode, Backend& backend, Allocations& memory)
    : cfg_(config), widest_window_(widest_window(config)), band_mode_(band_mode), backend_(backend), ring_(config, backend, memory) {
  const std::size_t mb = static_cast<std::size_t>(cfg_.max_batch);
  const std::size_t seq_bytes = mb * sizeof(int32_t);
  const std::size_t slot_bytes = max_rows(cfg_) * sizeof(int64_t);
  dev_.seq_lens = static_cast<int32_t*>(memory.device(seq_bytes));
  dev_.block_tables = static_cast<int32_t*>(memory.device(mirror_table_bytes()));
  dev_.slot_mapping = static_cast<int64_t*>(memory.device(slot_bytes));
  seq_scratch_.resize(mb);
  slot_scratch_.resize(max_rows(cfg_));
}

std::size_t StepStaging::mirror_table_bytes() const {
  return static_cast<std::size_t>(cfg_.max_batch) * cfg_.max_blocks_per_seq * sizeof(int32_t);
}

// ---------------------------------------------------------------- validation

Lengths StepStaging::validate(const StepInputs& in) {
  if (in.num_seqs < 1 || in.num_seqs > cfg_.max_batch)
    throw_invalid("inputs.num_seqs", in.num_seqs, "1..max_batch = 1.." + std::to_string(cfg_.max_batch));
  if (in.space != MemorySpace::kHost && in.space != MemorySpace::kDevice)
    throw_invalid("inputs.space", static_cast<int>(in.space), "kHost or kDevice");
  if (!in.seq_lens) throw_invalid("inputs.seq_lens", "null", "a pointer to num_seqs lengths");
  if (!in.block_tables) throw_invalid("inputs.block_tables", "null", "a pointer to num_seqs block-table rows");
  if (std::find(cfg_.q_lens.begin(), cfg_.q_lens.end(), in.q_len) == cfg_.q_lens.end())
    throw_invalid("inputs.q_len", in.q_len,
                  "one of config().q_lens = " + list_text(cfg_.q_lens) + " (the q_lens graphs are made for)");
  if (!in.slot_mapping && cfg_.append_kv)
    throw_invalid("inputs.slot_mapping", "null",
                  in.q_len == 1 ? std::string("a pointer to num_seqs slots (append_kv is on)")
                                : "a pointer to num_seqs x q_len = " + std::to_string(in.num_seqs) + " x " +
                                      std::to_string(in.q_len) + " slots (append_kv is on)");
  if (in.max_seq_len < 0 || in.max_seq_len > cfg_.max_seq_len)
    throw_invalid("inputs.max_seq_len", in.max_seq_len,
                  "0 (no hint) or 1..max_seq_len = 1.." + std::to_string(cfg_.max_seq_len));
  (void)ring_.slot_of(in);  // inputs in the host staging buffers: only as handed out
  const int hint = in.max_seq_len;
  const bool device = in.space == MemorySpace::kDevice;
  const bool full = cfg_.validation == ValidationLevel::kFull;

  // Lengths: read unless they are on the device, a hint gives the band and kCheap trusts them.
  const bool read_lens = !device || (hint == 0 && band_mode_ == BandSelect::kHost) || full;
  const int32_t* lens = in.seq_lens;
  int max_len = 0;
  if (read_lens) {
    if (device) {
      backend_.download(seq_scratch_.data(), in.seq_lens, in.num_seqs * sizeof(int32_t), in.space);
      ++input_downloads_;
      lens = seq_scratch_.data();
    }
    max_len = check_lengths(in, lens);
  }
  const int band_len = hint != 0 ? hint : max_len;
  const int bs = cfg_.spec.block_size;
  if (band_len == 0 && in.block_table_stride < 1)  // lengths unknown here (kDevice, device inputs)
    throw_invalid("inputs.block_table_stride", in.block_table_stride, ">= 1");
  const int need_cols = (band_len + bs - 1) / bs;
  if (in.block_table_stride < need_cols)
    throw_invalid("inputs.block_table_stride", in.block_table_stride,
                  ">= ceil(" + std::string(hint != 0 ? "max_seq_len hint " : "max seq_len ") +
                      std::to_string(band_len) + " / block_size " + std::to_string(bs) + ") = " +
                      std::to_string(need_cols));
  if (full) check_tables_and_slots(in, lens);
  return Lengths{band_len, max_len};
}

// Every length 0 (a padded row) or in q_len..max_seq_len, and within the hint; returns the longest.
// A padded row (vLLM pads a graph batch so) attends nothing and appends nothing: the kernels leave
// its output rows untouched and skip its slots, which must be negative where they can be read here.
int StepStaging::check_lengths(const StepInputs& in, const int32_t* lens) const {
  const int n = in.num_seqs;
  int max_len = 0;
  bool padded = false;
  for (int i = 0; i < n; ++i) {
    const int len = lens[i];
    if (len == 0) {
      padded = true;
      continue;
    }
    if (len < in.q_len || len > cfg_.max_seq_len)
      throw_invalid("inputs.seq_lens[" + std::to_string(i) + "]", len,
                    "0 (a padded row) or " + std::string(in.q_len > 1 ? "q_len..max_seq_len = " : "1..max_seq_len = ") +
                        std::to_string(in.q_len) + ".." + std::to_string(cfg_.max_seq_len) +
                        (in.q_len > 1 ? " (seq_lens count the step's q_len new tokens)" : ""));
    max_len = std::max(max_len, len);
  }
  if (padded && in.slot_mapping && in.space == MemorySpace::kHost) check_padded_slots(in, lens, in.slot_mapping);
  if (in.max_seq_len != 0 && max_len > in.max_seq_len) {
    const int i = static_cast<int>(std::find(lens, lens + n, max_len) - lens);
    throw_invalid("inputs.max_seq_len", in.max_seq_len,
                  ">= every seq_len (seq_lens[" + std::to_string(i) + "] = " + std::to_string(max_len) +
                      "), or 0 for no hint");
  }
  return max_len;
}

// kFull: every block id a length uses (from the first block some layer's window reads: entries
// before it may hold any id, as vLLM's freed blocks do), and every slot (range, and its position:
// seq_len - 1, or seq_len - q_len + j for token j of q_len).
void StepStaging::check_tables_and_slots(const StepInputs& in, const int32_t* lens) {
  const int n = in.num_seqs;
  const int bs = cfg_.spec.block_size;
  const int32_t* bt = in.block_tables;
  const int64_t* slots = in.slot_mapping;
  if (in.space == MemorySpace::kDevice) {
    const std::size_t entries = static_cast<std::size_t>(n) * in.block_table_stride;
    if (bt_scratch_.size() < entries) bt_scratch_.resize(entries);  // grows once per new maximum
    backend_.download(bt_scratch_.data(), in.block_tables, entries * sizeof(int32_t), in.space);
    ++input_downloads_;
    bt = bt_scratch_.data();
    if (slots) {
      backend_.download(slot_scratch_.data(), in.slot_mapping, static_cast<std::size_t>(n) * in.q_len * sizeof(int64_t),
                        in.space);
      ++input_downloads_;
      slots = slot_scratch_.data();
    }
  }
  for (int i = 0; i < n; ++i) {
    const int used = (lens[i] + bs - 1) / bs;
    const int32_t* row = bt + static_cast<std::size_t>(i) * in.block_table_stride;
    // q_len rows read from their first row's window on (math::read_window).
    for (int j = math::window_origin(lens[i], math::read_window(widest_window_, in.q_len), bs) / bs; j < used; ++j)
      if (row[j] < 0 || row[j] >= cfg_.num_blocks)
        throw_invalid("inputs.block_tables[" + std::to_string(i) + "][" + std::to_string(j) + "]",
                      row[j], "0..num_blocks-1 = 0.." + std::to_string(cfg_.num_blocks - 1));
  }
  if (!slots) return;
  const int64_t cap = static_cast<int64_t>(cfg_.num_blocks) * bs;
  const int q = in.q_len;
  // Entry t = i * q + j: token j of sequence i. Named by its index, and for q > 1 its (i, j).
  auto slot_name = [&](int t) {
    std::string s = "inputs.slot_mapping[" + std::to_string(t) + "]";
    if (q > 1)
      s += " (sequence " + std::to_string(t / q) + ", token " + std::to_string(t % q) + " of q_len " + std::to_string(q) +
           ": position seq_len - q_len + " + std::to_string(t % q) + " = " + std::to_string(lens[t / q] - q + t % q) + ")";
    return s;
  };
  check_padded_slots(in, lens, slots);
  for (int t = 0; t < n * q; ++t)
    if (slots[t] >= cap)
      throw_invalid(slot_name(t), slots[t], "negative (skip) or 0..num_blocks*block_size-1 = 0.." + std::to_string(cap - 1));
  // seq_lens includes this step's tokens, so token j's slot is that of position seq_len - q + j (the
  // last, seq_len - 1). A slot of position seq_len (lengths counted before the append) is the classic
  // off-by-one: the attention would read a stale token and the new one would land past the length.
  for (int t = 0; t < n * q; ++t) {
    const int i = t / q;
    const int32_t* row = bt + static_cast<std::size_t>(i) * in.block_table_stride;
    const int len = math::row_len(lens[i], q, t % q);  // lengths checked: no overflow
    if (slots[t] < 0 || position_slot_ok(slots[t], len, row, in.block_table_stride, bs, cfg_.num_blocks)) continue;
    require_position_slot(slot_name(t), slots[t], len, row, in.block_table_stride, bs, cfg_.num_blocks,
                          "inputs.block_tables[" + std::to_string(i) + "]",
                          q > 1 ? "seq_len - q_len + " + std::to_string(t % q) : "seq_len - 1");
  }
}

// A padded row's (seq_len 0) slots: negative, as the staging pads them. One it might write would
// land where no position of the row is (the kernels skip it and report a slot mismatch).
void StepStaging::check_padded_slots(const StepInputs& in, const int32_t* lens, const int64_t* slots) const {
  const int q = in.q_len;
  for (int i = 0; i < in.num_seqs; ++i) {
    if (lens[i] != 0) continue;
    for (int j = 0; j < q; ++j)
      if (slots[static_cast<std::size_t>(i) * q + j] >= 0)
        throw_invalid("inputs.slot_mapping[" + std::to_string(i * q + j) + "]", slots[static_cast<std::size_t>(i) * q + j],
                      "negative: seq_lens[" + std::to_string(i) + "] = 0 marks a padded row, which appends nothing "
                      "(pass -1 there, or live rows only)");
  }
}

// ---------------------------------------------------------------- staging

void StepStaging::stage(const StepInputs& in, int batch, int band_len) { stage_inputs(in, batch, band_len, false); }

void StepStaging::stage_inputs(const StepInputs& in, int batch, int band_len, bool synthetic) {
  const int n = in.num_seqs;
  const int tokens = batch * in.q_len;                  // the append's [batch, q_len] slots
  const int slots = in.slot_mapping ? n * in.q_len : 0;  // tokens [slots, tokens) get slot -1
  // band_len 0: the lengths were not read (kDevice, device inputs): every column the row may use.
  const std::size_t cols =
      band_len > 0 ? static_cast<std::size_t>((band_len + cfg_.spec.block_size - 1) / cfg_.spec.block_size)
                   : static_cast<std::size_t>(std::min(in.block_table_stride, cfg_.max_blocks_per_seq));
  if (in.space == MemorySpace::kHost) {
    // Only host inputs go through a pinned slot, and wait for it; device inputs need no event (stream
    // order, and begin_step's wait on a stream change, keep the static buffers safe).
    const int slot = synthetic ? ring_.acquire_spare() : ring_.acquire_for_step(ring_.slot_of(in));
    stage_host(in, batch, cols, ring_[slot]);
    ring_.release(slot, /*step=*/!synthetic);
  } else {
    const std::size_t dpitch = static_cast<std::size_t>(cfg_.max_blocks_per_seq) * sizeof(int32_t);
    const std::size_t spitch = static_cast<std::size_t>(in.block_table_stride) * sizeof(int32_t);
    const int pad = batch - n;
    backend_.stage_2d(dev_.seq_lens, 0, in.seq_lens, 0, n * sizeof(int32_t), 1, in.space);
    if (pad) backend_.stage_fill(dev_.seq_lens + n, 0, pad * sizeof(int32_t));
    if (slots) backend_.stage_2d(dev_.slot_mapping, 0, in.slot_mapping, 0, slots * sizeof(int64_t), 1, in.space);
    if (slots < tokens)
      backend_.stage_fill(dev_.slot_mapping + slots, 0xff, (tokens - slots) * sizeof(int64_t));  // -1
    backend_.stage_2d(dev_.block_tables, dpitch, in.block_tables, spitch, cols * sizeof(int32_t), n, in.space);
  }
}

// Host inputs: into the pinned mirrors (unless already there), padded rows filled, then one DMA each.
void StepStaging::stage_host(const StepInputs& in, int batch, std::size_t cols, const StagingRing::Slot& m) {
  const int n = in.num_seqs;
  const int tokens = batch * in.q_len;
  const int slots = in.slot_mapping ? n * in.q_len : 0;
  const std::size_t dpitch = static_cast<std::size_t>(cfg_.max_blocks_per_seq) * sizeof(int32_t);
  const std::size_t spitch = static_cast<std::size_t>(in.block_table_stride) * sizeof(int32_t);
  const std::size_t width = cols * sizeof(int32_t);
  if (in.seq_lens != m.seq_lens) {
    std::memcpy(m.seq_lens, in.seq_lens, n * sizeof(int32_t));
    staging_copy_bytes_ += n * sizeof(int32_t);
  }
  std::fill(m.seq_lens + n, m.seq_lens + batch, 0);
  if (slots && in.slot_mapping != m.slot_mapping) {
    std::memcpy(m.slot_mapping, in.slot_mapping, slots * sizeof(int64_t));
    staging_copy_bytes_ += slots * sizeof(int64_t);
  }
  std::fill(m.slot_mapping + slots, m.slot_mapping + tokens, int64_t{-1});
  if (in.block_tables != m.block_tables) {
    for (int i = 0; i < n; ++i)
      std::memcpy(reinterpret_cast<char*>(m.block_tables) + i * dpitch,
                  reinterpret_cast<const char*>(in.block_tables) + i * spitch, width);
    staging_copy_bytes_ += static_cast<long long>(n) * width;
  }
  backend_.stage_2d(dev_.seq_lens, 0, m.seq_lens, 0, batch * sizeof(int32_t), 1, MemorySpace::kHost);
  backend_.stage_2d(dev_.slot_mapping, 0, m.slot_mapping, 0, tokens * sizeof(int64_t), 1, MemorySpace::kHost);
  backend_.stage_2d(dev_.block_tables, dpitch, m.block_tables, dpitch, width, n, MemorySpace::kHost);
}

void StepStaging::stage_synthetic(const BucketPlan& plan) {
  // At least q_len: a step's lengths count its q_len tokens.
  const int len = std::max(plan.q_len, plan.band_lo + (plan.band_hi - plan.band_lo + 1) / 2);
  const int cols = (len + cfg_.spec.block_size - 1) / cfg_.spec.block_size;
  std::vector<int32_t> lens(plan.batch, len), tables(static_cast<std::size_t>(plan.batch) * cols);
  for (std::size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i % cfg_.num_blocks);
  StepInputs in;
  in.num_seqs = plan.batch;
  in.q_len = plan.q_len;
  in.seq_lens = lens.data();
  in.block_tables = tables.data();
  in.block_table_stride = cols;
  const long long copied = staging_copy_bytes_;  // not a step's copy
  stage_inputs(in, plan.batch, len, /*synthetic=*/true);
  staging_copy_bytes_ = copied;
}

HostStaging StepStaging::host_staging() { return ring_.hand_out(); }

}  // namespace decodegraph::detail
