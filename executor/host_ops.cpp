// The host backend's kernels (host_ops.hpp).
//
// Attention runs with the kernels' semantics for staged inputs that validation did not see
// (kCheap, or device inputs with a max_seq_len hint): lengths clamped to [0, max_seq_len], block
// ids clamped to [0, num_blocks) and the first bad id reported through DecodeArgs::bad_block.
// The append skips (and reports) a slot past the cache or not at its position, as the kernel does.
// host:: would throw instead, in the middle of a replay; the host backend gives it a sanitised copy,
// so both backends compute the same numbers and report the same way.
#include "executor/host_ops.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "decodegraph/fault.hpp"
#include "kernels/append_report.hpp"
#include "kernels/decode_math.hpp"

namespace decodegraph::detail {
namespace {

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

// Runs `run(args)` as the kernels would see the staged inputs (see the top of this file).
template <class Run>
void run_with_device_semantics(const DecodeArgs& a, const Run& run) {
  const int bs = a.spec.block_size;
  const int window = math::read_window(a.spec.sliding_window, a.q_len);  // q_len rows read from row 0's window
  auto bad_id = [&](int32_t id) { return id < 0 || id >= a.num_blocks; };
  bool clean = true;
  for (int i = 0; i < a.num_seqs && clean; ++i) {
    const int len = a.seq_lens[i];
    if (len < 0 || len > a.max_seq_len || (len > 0 && len < a.q_len)) {
      clean = false;
      break;
    }
    const int32_t* row = a.block_tables + static_cast<int64_t>(i) * a.block_table_stride;
    for (int j = math::window_origin(len, window, bs) / bs; j < num_partitions(len, bs); ++j)
      if (bad_id(row[j])) {
        clean = false;
        break;
      }
  }
  if (clean) {
    run(a);
    return;
  }
  std::vector<int32_t> lens(a.seq_lens, a.seq_lens + a.num_seqs);
  std::vector<int32_t> table(a.block_tables,
                             a.block_tables + static_cast<std::size_t>(a.num_seqs) * a.block_table_stride);
  int first_bad = 0;
  for (int i = 0; i < a.num_seqs; ++i) {
    lens[i] = std::clamp(lens[i], 0, a.max_seq_len);
    if (lens[i] < a.q_len) lens[i] = 0;  // fewer tokens than query rows: the rows are left untouched
    int32_t* row = table.data() + static_cast<std::size_t>(i) * a.block_table_stride;
    // As the kernels: entries before a window's first block are never read, so never reported.
    for (int j = math::window_origin(lens[i], window, bs) / bs; j < num_partitions(lens[i], bs); ++j) {
      if (!bad_id(row[j])) continue;
      if (first_bad == 0) {
        const int64_t flat = static_cast<int64_t>(i) * a.block_table_stride + j + 1;
        first_bad = flat < INT_MAX ? static_cast<int>(flat) : INT_MAX;
      }
      row[j] = row[j] < 0 ? 0 : a.num_blocks - 1;
    }
  }
  if (first_bad != 0 && a.bad_block != nullptr && *a.bad_block == 0) *a.bad_block = first_bad;
  DecodeArgs b = a;
  b.seq_lens = lens.data();
  b.block_tables = table.data();
  run(b);
}

// The append as the kernel does it: a slot past the cache, or (with the staged lengths and tables)
// not the slot of its position or under a bad block id, is skipped and the first one reported
// through args.bad_slot
// (kernels/append_report.hpp, the kernel's own check); host:: would throw in the middle of a replay.
void run_append_with_device_semantics(const AppendArgs& args) {
  std::vector<int64_t> slots(args.slot_mapping, args.slot_mapping + args.num_tokens);
  for (int t = 0; t < args.num_tokens; ++t) {
    if (slots[t] < 0) continue;
    const int code = kernels::check_append_slot(slots[t], args.num_blocks, args.seq_lens, args.block_tables,
                                                args.block_table_stride, args.spec.block_size, t, args.tokens_per_seq);
    if (code == 0) continue;
    slots[t] = -1;
    if (args.bad_slot != nullptr && *args.bad_slot == 0) *args.bad_slot = code;
  }
  AppendArgs a = args;
  a.slot_mapping = slots.data();
  a.seq_lens = nullptr;  // checked above
  a.block_tables = nullptr;
  a.bad_slot = nullptr;
  host::append_kv(a);
}

}  // namespace

void check_kernel(const char* name) {
  if (fault::should_fail(fault::Site::kKernelLaunch))
    injected((std::string(name) + " launch (twin of a kernel launch)").c_str(), fault::Site::kKernelLaunch);
}

void run_attention_v1(const DecodeArgs& args) {
  check_kernel("host::paged_attention_v1");
  run_with_device_semantics(args, [](const DecodeArgs& a) { host::paged_attention_v1(a); });
}

void run_attention_v2(const DecodeArgs& args, int partition_size, void* workspace, std::size_t workspace_bytes) {
  check_kernel("host::paged_attention_v2");
  run_with_device_semantics(args, [&](const DecodeArgs& a) {
    host::paged_attention_v2(a, partition_size, workspace, workspace_bytes);
  });
}

void run_append(const AppendArgs& args) {
  check_kernel("host::append_kv");
  run_append_with_device_semantics(args);
}

}  // namespace decodegraph::detail
