// The cost model (docs/planning.md, "The cost model"). Pass 1 is a fluid model of its blocks
// moving through the resident slots in launch order: every streaming block gets the same share of
// the roof, capped at what one block streams alone, so a full wave runs at the roof while a partial
// last wave of a few blocks runs at their own rate. Blocks of one kind run in whole waves (closed
// form); with two kinds (a row's full partitions and its shorter last one), blocks with the same
// work that start together finish together, so the simulation steps from one such group
// ("cohort") to the next, a handful of events per wave. A block's fixed phase is its latency chain
// plus its instructions outside the main loop, issued on sub-partitions shared with the blocks that
// start with it; its stream is capped by the SM's issue rate over the loop's instructions per byte
// (issue 31; the figures from the static report). The merge is its latency chain (L2 round trips of
// its folds and its straight-line instructions) or its partials' bandwidth, whichever is longer.
// Each kernel adds a floor and a launch gap.
#include "executor/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "decodegraph/attention.hpp"
#include "kernels/decode_policy.hpp"
#include "kernels/merge_policy.hpp"
#include "executor/gqa_plan.hpp"
#include "kernels/occupancy.hpp"

namespace decodegraph::detail {

namespace {

constexpr double kBytesPerUsPerGbs = 1000.0;  // 1 GB/s = 1,000 bytes per microsecond

// Warp-instructions per microsecond one sub-partition issues.
double issue_per_us(const CostConstants& k) { return k.sm_clock_ghz * 1000.0 * k.issue_efficiency; }

enum class Family { kCudaCore, kTc, kFp8 };
struct InstrRow {
  Family family;
  DType q;  // kFloat16 for the fp8 rows (the report compiles fp8 caches with fp16 q; bf16 q is taken as the same)
  int d;
  Pass1InstrRow::Layout vllm, nhd;
};

// Per pass-1 kernel and layout, read off bench/results/static/after-fixed.json (scripts/kernel_report.sh
// --json; CostModel.InstructionTableMatchesTheStaticReport fails until this table matches the report it
// reads): the main loop's warp-instructions per K+V byte of a block (`warp_instr_per_kv_byte`, and
// `_nocap` without the soft-cap's block), at four warps: the CUDA-core kernel runs one warp per query
// head of its chunk (at least four), each with the same loop, so its figure scales with warps / 4 (the
// report's fp32 GQA 8 and 4 x 4 rows are 2x and 4x its GQA 1 row); then the warp-instructions per warp
// outside the tiles (`prologue_instr`, `epilogue_instr` on the V2 path, `epilogue_instr_v1`; the same
// at every group). To be replaced by decode_loop's measurements: the issue-bound rate
// (issue_efficiency's note) and the fixed phase (block_latency_us's).
constexpr InstrRow kInstrRows[] = {
    {Family::kCudaCore, DType::kBFloat16, 64, {0.265, 0.265, 326, 1187, 1180}, {0.246, 0.246, 229, 1166, 1159}},
    {Family::kCudaCore, DType::kBFloat16, 80, {0.466, 0.466, 322, 1141, 1134}, {0.449, 0.449, 233, 1234, 1226}},
    {Family::kCudaCore, DType::kBFloat16, 96, {0.389, 0.389, 322, 1141, 1134}, {0.374, 0.374, 233, 1234, 1226}},
    {Family::kCudaCore, DType::kBFloat16, 112, {0.333, 0.333, 326, 1141, 1134}, {0.321, 0.321, 237, 1231, 1224}},
    {Family::kCudaCore, DType::kBFloat16, 128, {0.269, 0.269, 324, 1102, 1095}, {0.246, 0.246, 229, 1086, 1079}},
    {Family::kCudaCore, DType::kBFloat16, 192, {0.384, 0.384, 312, 1056, 1047}, {0.372, 0.372, 235, 1145, 1136}},
    {Family::kCudaCore, DType::kBFloat16, 256, {0.268, 0.268, 298, 1020, 1013}, {0.248, 0.248, 222, 996, 989}},
    {Family::kCudaCore, DType::kFloat16, 64, {0.268, 0.268, 310, 1192, 1185}, {0.234, 0.234, 239, 1158, 1151}},
    {Family::kCudaCore, DType::kFloat16, 80, {0.466, 0.466, 318, 1141, 1134}, {0.449, 0.449, 234, 1234, 1226}},
    {Family::kCudaCore, DType::kFloat16, 96, {0.389, 0.389, 318, 1141, 1134}, {0.374, 0.374, 234, 1234, 1226}},
    {Family::kCudaCore, DType::kFloat16, 112, {0.333, 0.333, 323, 1141, 1134}, {0.321, 0.321, 237, 1233, 1226}},
    {Family::kCudaCore, DType::kFloat16, 128, {0.269, 0.269, 310, 1110, 1103}, {0.235, 0.235, 239, 1079, 1072}},
    {Family::kCudaCore, DType::kFloat16, 192, {0.384, 0.384, 311, 1056, 1047}, {0.372, 0.372, 233, 1147, 1138}},
    {Family::kCudaCore, DType::kFloat16, 256, {0.269, 0.269, 292, 1021, 1013}, {0.236, 0.236, 233, 993, 986}},
    {Family::kCudaCore, DType::kFloat32, 64, {0.173, 0.173, 302, 830, 760}, {0.141, 0.141, 226, 787, 717}},
    {Family::kCudaCore, DType::kFloat32, 80, {0.286, 0.286, 294, 801, 731}, {0.259, 0.259, 229, 799, 731}},
    {Family::kCudaCore, DType::kFloat32, 96, {0.238, 0.238, 294, 801, 731}, {0.215, 0.215, 229, 799, 731}},
    {Family::kCudaCore, DType::kFloat32, 112, {0.204, 0.204, 297, 801, 731}, {0.184, 0.184, 233, 803, 735}},
    {Family::kCudaCore, DType::kFloat32, 128, {0.172, 0.172, 287, 763, 693}, {0.141, 0.141, 220, 727, 657}},
    {Family::kCudaCore, DType::kFloat32, 192, {0.22, 0.22, 303, 611, 603}, {0.185, 0.185, 237, 613, 605}},
    {Family::kCudaCore, DType::kFloat32, 256, {0.153, 0.153, 300, 596, 590}, {0.129, 0.129, 233, 583, 577}},
    {Family::kFp8, DType::kFloat16, 64, {0.301, 0.248, 707, 268, 221}, {0.277, 0.258, 715, 302, 386}},
    {Family::kFp8, DType::kFloat16, 80, {0.431, 0.362, 654, 309, 279}, {0.342, 0.327, 641, 301, 273}},
    {Family::kFp8, DType::kFloat16, 96, {0.358, 0.301, 344, 308, 272}, {0.275, 0.262, 341, 304, 254}},
    {Family::kFp8, DType::kFloat16, 112, {0.318, 0.269, 717, 305, 276}, {0.251, 0.24, 722, 302, 268}},
    {Family::kFp8, DType::kFloat16, 128, {0.266, 0.223, 339, 307, 259}, {0.21, 0.2, 333, 303, 253}},
    {Family::kFp8, DType::kFloat16, 192, {0.248, 0.196, 528, 331, 308}, {0.176, 0.17, 412, 342, 328}},
    {Family::kFp8, DType::kFloat16, 256, {0.195, 0.155, 503, 363, 361}, {0.143, 0.138, 397, 360, 346}},
    {Family::kTc, DType::kBFloat16, 64, {0.141, 0.131, 656, 249, 220}, {0.12, 0.11, 564, 247, 218}},
    {Family::kTc, DType::kBFloat16, 80, {0.203, 0.195, 589, 279, 274}, {0.184, 0.176, 509, 277, 272}},
    {Family::kTc, DType::kBFloat16, 96, {0.168, 0.161, 440, 260, 241}, {0.147, 0.141, 368, 261, 246}},
    {Family::kTc, DType::kBFloat16, 112, {0.152, 0.146, 636, 273, 266}, {0.138, 0.132, 560, 272, 265}},
    {Family::kTc, DType::kBFloat16, 128, {0.124, 0.119, 448, 265, 264}, {0.11, 0.105, 367, 266, 265}},
    {Family::kTc, DType::kBFloat16, 192, {0.184, 0.178, 480, 284, 305}, {0.158, 0.151, 406, 284, 305}},
    {Family::kTc, DType::kBFloat16, 256, {0.138, 0.133, 451, 282, 331}, {0.122, 0.117, 375, 266, 316}},
    {Family::kTc, DType::kFloat16, 64, {0.141, 0.131, 656, 251, 220}, {0.12, 0.11, 564, 249, 218}},
    {Family::kTc, DType::kFloat16, 80, {0.204, 0.196, 589, 281, 274}, {0.184, 0.177, 509, 279, 272}},
    {Family::kTc, DType::kFloat16, 96, {0.169, 0.162, 440, 262, 241}, {0.148, 0.141, 368, 263, 246}},
    {Family::kTc, DType::kFloat16, 112, {0.152, 0.147, 636, 275, 266}, {0.138, 0.133, 560, 274, 265}},
    {Family::kTc, DType::kFloat16, 128, {0.125, 0.12, 448, 267, 264}, {0.11, 0.105, 367, 268, 265}},
    {Family::kTc, DType::kFloat16, 192, {0.185, 0.178, 480, 286, 305}, {0.158, 0.152, 406, 286, 305}},
    {Family::kTc, DType::kFloat16, 256, {0.139, 0.134, 451, 284, 331}, {0.123, 0.118, 375, 268, 316}},
};

struct Cohort {
  long long count;
  bool streaming;  // false: in its fixed phase, ending at `end` (time); true: ending at `end` (offset)
  double end;
  double bytes;    // to stream after the fixed phase
};

}  // namespace

Pass1InstrRow pass1_instr_row(DType q, bool fp8, bool tensor_cores, int head_size) {
  const Family f = fp8 ? Family::kFp8 : tensor_cores ? Family::kTc : Family::kCudaCore;
  if (fp8) q = DType::kFloat16;
  for (const InstrRow& r : kInstrRows)
    if (r.family == f && r.q == q && r.d == head_size) return {true, r.vllm, r.nhd};
  return {};
}

Pass1Issue pass1_issue(const AttentionSpec& spec, int q_len, int num_sms, bool v2, const CostConstants& k) {
  const int elem = static_cast<int>(spec.kv_elem_size());
  const bool tc = kernels::pass1_uses_tensor_cores(elem, kernels::pass1_rows(spec.group_size(), q_len));
  Pass1Issue r;
  r.warps = (kernels::pass1_resources(spec, q_len).threads + 31) / 32;
  r.num_sms = std::max(1, num_sms);
  const Pass1InstrRow row = pass1_instr_row(spec.dtype, elem == 1, tc, spec.head_size);
  if (row.found) {
    const Pass1InstrRow::Layout& l = spec.layout == KVLayout::kNHD ? row.nhd : row.vllm;
    const double at4 = spec.logit_softcap > 0 ? l.per_byte : l.per_byte_nocap;
    r.loop_instr_per_byte = tc ? at4 : at4 * r.warps / 4.0;
    r.outside_instr = l.prologue + (v2 ? l.epilogue_v2 : l.epilogue_v1);
  }
  if (k.loop_instr_per_byte_override >= 0) r.loop_instr_per_byte = k.loop_instr_per_byte_override;
  if (k.outside_instr_override >= 0) r.outside_instr = k.outside_instr_override;
  return r;
}

double block_fixed_us(const Pass1Issue& issue, double starting, long long slots, const CostConstants& k) {
  if (issue.outside_instr <= 0) return k.block_latency_us;
  // Blocks that start together spread over the SMs (at most the resident ones per SM) and their
  // warps over the sub-partitions (at least one on the busiest), which issue them in turn.
  const double sms = std::max(1, issue.num_sms);
  const double per_sm = std::clamp(starting / sms, 1.0, std::max(1.0, static_cast<double>(slots) / sms));
  const double warps_per_sub = std::max(1.0, per_sm * issue.warps / k.sub_partitions);
  return k.block_latency_us + warps_per_sub * issue.outside_instr / issue_per_us(k);
}

double simulate_waves(long long rows, int grid_x, int full, double full_bytes, int tail, double tail_bytes,
                      long long slots, const CostConstants& k, const Pass1Issue& issue) {
  if (rows <= 0 || grid_x <= 0 || slots <= 0) return 0;
  const double block_rate = k.block_gbs * kBytesPerUsPerGbs;  // bytes per us
  const double roof = k.read_gbs * kBytesPerUsPerGbs;
  // The issue cap: each SM issues sub_partitions x issue_per_us warp-instructions per us, shared by
  // its streaming blocks; fewer streaming blocks than SMs get one SM each.
  const double sm_bytes = issue.loop_instr_per_byte > 0
                              ? k.sub_partitions * issue_per_us(k) / issue.loop_instr_per_byte
                              : std::numeric_limits<double>::infinity();
  const double sms = std::max(1, issue.num_sms);
  auto rate_of = [&](double streaming) {
    return std::min({block_rate, roof / streaming, sm_bytes * std::min(streaming, sms) / streaming});
  };
  auto fixed_of = [&](double starting) { return block_fixed_us(issue, starting, slots, k); };
  // Idle blocks (past their row's length) hold a slot only to read the length and exit: their slot
  // time, spread over the slots, is added instead of simulated (they would only stagger the others).
  const long long idle = rows * (grid_x - full - tail);
  const double idle_us = static_cast<double>(idle) * k.idle_block_us / static_cast<double>(slots);
  if (tail == 0 || full == 0 || tail_bytes == full_bytes) {
    // One kind of block: every wave starts together and ends together.
    const long long n = rows * (full + tail);
    const double bytes = full > 0 ? full_bytes : tail_bytes;
    auto wave = [&](long long c) { return fixed_of(static_cast<double>(c)) + bytes / rate_of(static_cast<double>(c)); };
    const long long waves = n / slots, rest = n % slots;
    return idle_us + static_cast<double>(waves) * (waves > 0 ? wave(slots) : 0.0) + (rest > 0 ? wave(rest) : 0.0);
  }
  // Two kinds, in launch order: each row is `full` blocks of full_bytes, then `tail` of tail_bytes.
  const long long period = full + tail, total = rows * period;
  auto before = [&](long long u, int cls) -> long long {  // blocks of a kind among the first u
    const long long r = u / period, x = u % period;
    return cls == 0 ? r * full + std::min<long long>(x, full) : r * tail + std::max<long long>(0, x - full);
  };
  const double class_bytes[2] = {full_bytes, tail_bytes};
  // Cohorts ending within 3 % of a block's time of each other are merged (at their mean end): the
  // two kinds stagger the ends, and without it a grid of 10^5 blocks would be simulated block by block.
  const double first = static_cast<double>(std::min(slots, total));
  const double slot_rate = rate_of(first);
  const double quantum = 0.03 * (fixed_of(first) + std::max(full_bytes, tail_bytes) / slot_rate);

  std::vector<Cohort> cohorts, kept;
  double t = 0, off = 0;  // time; bytes every streaming block has streamed since t = 0
  long long next = 0, resident = 0, streaming = 0;
  for (int guard = 0; guard < 1000000; ++guard) {
    if (next < total && resident < slots) {
      const long long take = std::min(slots - resident, total - next);
      const double fixed = fixed_of(static_cast<double>(take));  // the blocks that start together
      for (int cls = 0; cls < 2; ++cls) {
        const long long n = before(next + take, cls) - before(next, cls);
        if (n > 0) cohorts.push_back({n, false, t + fixed, class_bytes[cls]});
      }
      resident += take;
      next += take;
    }
    if (cohorts.empty()) break;
    const double rate = streaming > 0 ? rate_of(static_cast<double>(streaming)) : 0;
    double dt = std::numeric_limits<double>::infinity();
    for (const Cohort& c : cohorts) dt = std::min(dt, c.streaming ? (c.end - off) / rate : c.end - t);
    dt = std::max(0.0, dt);
    t += dt;
    off += rate * dt;
    const double eps_t = 1e-9 * (1 + t), eps_b = 1e-9 * (1 + off);
    const double tol_b = quantum * (rate > 0 ? rate : slot_rate);
    kept.clear();
    for (Cohort c : cohorts) {
      if (!c.streaming && c.end <= t + eps_t) {
        c.streaming = true;
        c.end = off + c.bytes;
        streaming += c.count;
      } else if (c.streaming && c.end <= off + eps_b) {
        resident -= c.count;
        streaming -= c.count;
        continue;
      }
      // Cohorts that will finish together (within the quantum) are one.
      auto same = std::find_if(kept.begin(), kept.end(), [&](const Cohort& o) {
        if (o.streaming != c.streaming) return false;
        if (c.streaming) return std::fabs(o.end - c.end) <= tol_b;
        return o.bytes == c.bytes && std::fabs(o.end - c.end) <= quantum;
      });
      if (same != kept.end()) {
        const double n = static_cast<double>(same->count + c.count);
        same->end = (same->end * static_cast<double>(same->count) + c.end * static_cast<double>(c.count)) / n;
        same->count += c.count;
      } else {
        kept.push_back(c);
      }
    }
    cohorts.swap(kept);
  }
  return idle_us + t;
}

namespace {

/// Resident merge blocks per SM: the merge kernel's threads and registers, no other limit.
int merge_blocks_per_sm(int threads, const CostConstants& k) {
  kernels::KernelResources r;
  r.threads = threads;
  r.registers = k.merge_registers;
  r.smem_bytes = k.merge_smem_bytes;  // the tree's and the maxima's shared arrays
  return std::max(1, kernels::blocks_per_sm(r));
}

double merge_us(const ExecutorConfig& c, const BucketPlan& p, int n, const CostConstants& k) {
  const AttentionSpec& s = c.spec;
  const double rows = static_cast<double>(p.batch) * p.q_len;  // query rows: q_len per sequence
  const double partial_bytes = rows * s.num_q_heads * n * (s.head_size + 2.0) * 4.0;  // read once
  int threads, blocks_per_row, rounds;
  if (k.serial_merge) {
    // Before issue 19: one block of head_size threads per (sequence, head); the max, the weights
    // into shared memory, then one fold over every partition with ~4 loads per round trip.
    threads = (s.head_size + 31) / 32 * 32;
    blocks_per_row = 1;
    rounds = n == 1 ? 1 : 2 + (n + 3) / 4;
  } else {
    // kernels/merge_partitions.cuh: the first kMergeUnroll partitions of every fold are loaded
    // with the maxima (one round trip), rows longer than groups x kMergeUnroll read the rest of their
    // maxima (one more) and fold kMergeUnroll partitions per further round trip.
    const int groups = kernels::merge_groups(p.max_partitions);
    threads = kernels::merge_threads(p.max_partitions);
    blocks_per_row = kernels::merge_slices(s.head_size);
    const int per_fold = (n + groups - 1) / groups;
    rounds = 1;
    if (n > groups * kernels::kMergeUnroll) rounds += 1 + (per_fold - 1) / kernels::kMergeUnroll;
  }
  const double blocks = rows * s.num_q_heads * blocks_per_row;
  const double sms = std::max(1, c.device_model.num_sms);
  const int per_sm = merge_blocks_per_sm(threads, k);
  const double waves = std::ceil(blocks / (sms * per_sm));
  // Each wave's chain: its round trips, and its straight-line instructions issued on sub-partitions
  // shared by the merge warps resident together (a wave's blocks spread over the SMs).
  const double together = std::clamp(blocks / sms, 1.0, static_cast<double>(per_sm));
  const double warps_per_sub = std::max(1.0, together * ((threads + 31) / 32) / k.sub_partitions);
  const double instr_us = warps_per_sub * k.merge_chain_instr / issue_per_us(k);
  const double chain = waves * (rounds * k.l2_round_trip_us + instr_us);
  const double gbs = partial_bytes <= k.l2_bytes ? k.l2_gbs : k.read_gbs;
  return std::max(chain, partial_bytes / (gbs * kBytesPerUsPerGbs));
}

}  // namespace

CostBreakdown predict_call(const ExecutorConfig& c, const BucketPlan& p, int len, const CostConstants& k) {
  const AttentionSpec& s = c.spec;
  const double esize = static_cast<double>(dtype_size(s.dtype));       // q and out
  const double kv_esize = static_cast<double>(s.kv_elem_size());      // the cache (1 for fp8)
  const bool v2 = p.kernel == KernelKind::kV2;
  len = std::max(1, std::min(len, p.launch_len > 0 ? p.launch_len : len));  // the kernels clamp to it
  // q_len x group rows per KV head (kernels::pass1_rows), split into head chunks of at most 16: each
  // chunk's blocks stream the KV head's K and V again (from L2 where they meet there).
  const int chunks = kernels::pass1_head_chunks(s, p.q_len);
  const int group = s.num_q_heads / s.num_kv_heads;
  const double rows_per_block = static_cast<double>(group) * p.q_len / chunks;  // real query rows
  const double kv_token = 2.0 * s.head_size * kv_esize;        // K + V of one KV head
  const double partial_row = (s.head_size + 2.0) * 4.0;        // one query row's fp32 partials, per head
  // q_len rows per sequence (speculative decoding): a block serves its chunk's query rows over the
  // same K/V, so each block's KV bytes and stream rate are those of one row; what grows with q_len
  // is q, out, the partials and, past 16 rows, the chunks (the packed rows' extra math is not
  // modelled). The slots are those of the kernel the rows select (pass1_slots).
  const double q_rows = p.q_len;
  const long long rows = static_cast<long long>(p.batch) * s.num_kv_heads * chunks;
  const long long slots = pass1_slots(c, p.q_len);

  CostBreakdown r;
  const Pass1Issue issue = pass1_issue(s, p.q_len, c.device_model.num_sms, v2, k);
  // Pass 1 three times: as it is; without block fixed phases and idle blocks (the difference is the
  // fixed term); and also without the issue cap (the difference to the second is the cap's share).
  CostConstants no_fixed = k;
  no_fixed.block_latency_us = 0;
  no_fixed.idle_block_us = 0;
  Pass1Issue no_fixed_issue = issue;
  no_fixed_issue.outside_instr = 0;
  Pass1Issue no_cap = no_fixed_issue;
  no_cap.loop_instr_per_byte = 0;
  auto pass1 = [&](auto&& waves) {
    r.pass1_us = waves(k, issue);
    const double stream = waves(no_fixed, no_fixed_issue);
    r.fixed_us = std::max(0.0, r.pass1_us - stream);
    r.loop_us = r.pass1_us - r.fixed_us;
    r.issue_us = std::max(0.0, stream - waves(no_fixed, no_cap));
  };
  int n = 1;
  if (v2) {
    const int P = p.partition_size;
    n = num_partitions(len, P);
    const int last = len - (n - 1) * P;
    const double written = rows_per_block * partial_row;
    pass1([&](const CostConstants& kk, const Pass1Issue& ii) {
      return simulate_waves(rows, p.grid_x, n - 1, P * kv_token + written, 1, last * kv_token + written, slots, kk, ii);
    });
    r.merge_us = merge_us(c, p, n, k);
    r.launch_us = 2 * (k.kernel_floor_us + k.launch_gap_us);
  } else {
    pass1([&](const CostConstants& kk, const Pass1Issue& ii) {
      return simulate_waves(rows, 1, 0, 0, 1, len * kv_token, slots, kk, ii);
    });
    r.launch_us = k.kernel_floor_us + k.launch_gap_us;
  }
  r.us = r.pass1_us + r.merge_us + r.launch_us;
  const double qo_row = static_cast<double>(s.num_q_heads) * s.head_size * esize;
  r.bytes = static_cast<double>(p.batch) * (static_cast<double>(len) * s.num_kv_heads * kv_token + 2 * q_rows * qo_row);
  if (v2) r.bytes += 2.0 * p.batch * q_rows * s.num_q_heads * partial_row * n;
  r.roof_share = r.bytes / (r.us * k.read_gbs * kBytesPerUsPerGbs);
  return r;
}

}  // namespace decodegraph::detail
