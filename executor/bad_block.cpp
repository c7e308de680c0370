// The delayed report of clamped block ids and skipped slots (bad_block.hpp).
#include "executor/bad_block.hpp"

#include <climits>
#include <string>

#include "decodegraph/error.hpp"
#include "kernels/append_report.hpp"

namespace decodegraph {

const char* to_string(CorruptedStepReport::Kind kind) {
  switch (kind) {
    case CorruptedStepReport::Kind::kBadBlockId: return "bad_block_id";
    case CorruptedStepReport::Kind::kSlotMismatch: return "slot_mismatch";
    case CorruptedStepReport::Kind::kSlotPastCache: return "slot_past_cache";
  }
  return "unknown";
}

namespace detail {
namespace {

using Kind = CorruptedStepReport::Kind;

/// What a non-zero flag value says: positive, a pass-1 kernel's clamped block id (flat table entry
/// + 1, INT_MAX past that); negative, the append's skipped slot (kernels/append_report.hpp).
struct Decoded {
  Kind kind = Kind::kBadBlockId;
  int sequence = -1;  // -1: not recorded
  int column = -1;
  int token = -1;     // the append's: the index into the step's [num_seqs, q_len] slot mapping
};

// `q`: the q_len of every step the report covers (-1: they differed, so a token names no sequence).
Decoded decode(int v, int stride, int q) {
  Decoded d;
  if (v < 0) {
    d.kind = kernels::append_report_kind(v) == kernels::AppendReport::kSlotPastCache ? Kind::kSlotPastCache
                                                                                     : Kind::kSlotMismatch;
    d.token = kernels::append_report_token(v);
    d.sequence = q >= 1 ? d.token / q : -1;
  } else if (v != INT_MAX) {
    d.sequence = (v - 1) / stride;
    d.column = (v - 1) % stride;
  }
  return d;
}

}  // namespace

BadBlockReport::BadBlockReport(const ExecutorConfig& config, Backend& backend, Allocations& memory)
    : cfg_(config), backend_(backend) {
  flag_ = static_cast<int*>(memory.device(kDeviceBytes));  // zeroed
  flag_h_ = static_cast<int*>(memory.host(sizeof(int)));
  *flag_h_ = 0;  // cudaMallocHost does not zero
}

// The pinned flag is read without a CUDA call: a 4-byte aligned DMA write is seen whole or not at
// all, and the flag only goes from 0 to a report until it is reset here. Resetting waits for the
// last step first, so no graph still in flight can copy the old value back afterwards.
void BadBlockReport::report(bool wait, long long steps, bool from_step) {
  if (wait) backend_.wait_last_step();
  if (*static_cast<volatile int*>(flag_h_) == 0) {
    if (wait) {
      reported_through_ = steps;
      q_since_ = 0;
    }
    return;
  }
  if (!wait) backend_.wait_last_step();
  const int v = *static_cast<volatile int*>(flag_h_);
  const int zero = 0;
  backend_.upload(flag_, &zero, sizeof zero);
  *static_cast<volatile int*>(flag_h_) = 0;
  ++reports_;
  const long long from = reported_through_ + 1;
  reported_through_ = steps;
  const int q = q_since_ == 0 ? 1 : q_since_;
  q_since_ = 0;
  const Decoded d = decode(v, cfg_.max_blocks_per_seq, q);
  const std::string seq = d.sequence >= 0 ? "sequence " + std::to_string(d.sequence) : "one sequence (not recorded)";
  const std::string row = d.sequence >= 0 ? std::to_string(d.sequence) : "?";
  // The append's entry: [sequence] for q_len 1, else its index into [num_seqs, q_len], named as
  // kFull names it (staging.cpp). The lengths of that step are gone: the position stays symbolic.
  std::string slot = "inputs.slot_mapping[" + (d.token >= 0 ? std::to_string(d.token) : row) + "]";
  std::string position = "seq_len - 1";
  if (d.token >= 0 && q > 1) {
    const int j = d.token % q;
    position = "seq_len - q_len + " + std::to_string(j);
    slot += " (sequence " + std::to_string(d.sequence) + ", token " + std::to_string(j) + " of q_len " +
            std::to_string(q) + ": position " + position + " = seq_len - " + std::to_string(q - j) + ")";
  } else if (d.token >= 0 && q < 1) {
    position = "seq_len - q_len + j";
    slot += " (of a [num_seqs, q_len] slot mapping; q_len differed between those steps, so its sequence is not known)";
  }
  const std::string when =
      from == steps ? "step " + std::to_string(steps)
                    : "one of steps " + std::to_string(from) + ".." + std::to_string(steps) + " (those since the last report)";
  std::string what;
  std::string damage;
  switch (d.kind) {
    case Kind::kBadBlockId:
      what = (d.sequence >= 0 ? "inputs.block_tables[" + row + "][" + std::to_string(d.column) + "]"
                              : std::string("inputs.block_tables (an entry past index INT_MAX)")) +
             " was outside 0..num_blocks-1 = 0.." + std::to_string(cfg_.num_blocks - 1) +
             ": the kernels clamped it into the cache";
      damage = "its attention output at that step is wrong (the token generated from it too)";
      break;
    case Kind::kSlotMismatch:
      what = slot + " was not the slot of position " + position + " under its block-table row " +
             (q == 1 ? "(seq_lens counts the token appended this step; a slot of position seq_len, or lengths "
                       "counted before the append, do this)"
                     : "(seq_lens counts every token appended this step; a slot one position late, or lengths "
                       "counted before the append, do this)") +
             ": the append skipped it";
      damage = "its new K/V was not written, so that step's output and every later one read a stale slot";
      break;
    case Kind::kSlotPastCache:
      what = slot + " was at or past num_blocks * block_size = " +
             std::to_string(static_cast<long long>(cfg_.num_blocks) * cfg_.spec.block_size) + ": the append skipped it";
      damage = "its new K/V was not written, so that step's output and every later one read a stale slot";
      break;
  }
  const std::string todo = from_step ? " This step() ran nothing: submit its inputs again." : "";
  throw CorruptedStepReport(
      "corrupted step report (" + std::string(to_string(d.kind)) + ", " + seq + ", " + when + "): " + what +
          ". ValidationLevel::kCheap leaves block ids and slots to the caller and the kernels found this one "
          "while the step ran; for " + seq + " of that step " + damage + ". Re-prefill " + seq +
          " (drop what it generated since) before decoding it further; the other sequences are unaffected." +
          todo + " Only the first such mistake is recorded; kFull would have rejected the step up front. "
          "Reported once; the executor is usable.",
      d.kind, from, steps, from_step, d.sequence, d.column);
}

}  // namespace detail
}  // namespace decodegraph
