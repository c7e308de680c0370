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
  double vllm, vllm_nocap, nhd, nhd_nocap;
};

// The main loop's warp-instructions per K+V byte of a block (the static report's
// `warp_instr_per_kv_byte`, with and without the soft-cap's block: `_nocap`), per pass-1 kernel,
// at four warps: the CUDA-core kernel runs one warp per query head of its chunk (at least four), each
// with the same loop, so its figure scales with warps / 4 (the report's fp32 GQA 8 and 4 x 4 rows are
// 2x and 4x its GQA 1 row). Read off bench/results/static/after-edges.json (scripts/kernel_report.sh
// --json); CostModel.InstructionTableMatchesTheStaticReport fails until this table matches the report
// it reads. To be replaced by decode_loop's measured issue-bound rate (issue_efficiency's note).
constexpr InstrRow kInstrRows[] = {
    {Family::kCudaCore, DType::kBFloat16, 64, 0.265, 0.265, 0.244, 0.244},
    {Family::kCudaCore, DType::kBFloat16, 80, 0.462, 0.462, 0.448, 0.448},
    {Family::kCudaCore, DType::kBFloat16, 96, 0.385, 0.385, 0.373, 0.373},
    {Family::kCudaCore, DType::kBFloat16, 112, 0.33, 0.33, 0.319, 0.319},
    {Family::kCudaCore, DType::kBFloat16, 128, 0.269, 0.269, 0.246, 0.246},
    {Family::kCudaCore, DType::kBFloat16, 192, 0.385, 0.385, 0.371, 0.371},
    {Family::kCudaCore, DType::kBFloat16, 256, 0.268, 0.268, 0.247, 0.247},
    {Family::kCudaCore, DType::kFloat16, 64, 0.268, 0.268, 0.233, 0.233},
    {Family::kCudaCore, DType::kFloat16, 80, 0.462, 0.462, 0.448, 0.448},
    {Family::kCudaCore, DType::kFloat16, 96, 0.385, 0.385, 0.373, 0.373},
    {Family::kCudaCore, DType::kFloat16, 112, 0.33, 0.33, 0.319, 0.319},
    {Family::kCudaCore, DType::kFloat16, 128, 0.269, 0.269, 0.234, 0.234},
    {Family::kCudaCore, DType::kFloat16, 192, 0.385, 0.385, 0.371, 0.371},
    {Family::kCudaCore, DType::kFloat16, 256, 0.269, 0.269, 0.235, 0.235},
    {Family::kCudaCore, DType::kFloat32, 64, 0.173, 0.173, 0.139, 0.139},
    {Family::kCudaCore, DType::kFloat32, 80, 0.284, 0.284, 0.255, 0.255},
    {Family::kCudaCore, DType::kFloat32, 96, 0.237, 0.237, 0.212, 0.212},
    {Family::kCudaCore, DType::kFloat32, 112, 0.203, 0.203, 0.182, 0.182},
    {Family::kCudaCore, DType::kFloat32, 128, 0.172, 0.172, 0.14, 0.14},
    {Family::kCudaCore, DType::kFloat32, 192, 0.219, 0.219, 0.182, 0.182},
    {Family::kCudaCore, DType::kFloat32, 256, 0.153, 0.153, 0.128, 0.128},
    {Family::kFp8, DType::kFloat16, 64, 0.301, 0.281, 0.271, 0.251},
    {Family::kFp8, DType::kFloat16, 80, 0.436, 0.42, 0.334, 0.319},
    {Family::kFp8, DType::kFloat16, 96, 0.353, 0.34, 0.27, 0.257},
    {Family::kFp8, DType::kFloat16, 112, 0.31, 0.299, 0.249, 0.238},
    {Family::kFp8, DType::kFloat16, 128, 0.266, 0.256, 0.209, 0.199},
    {Family::kFp8, DType::kFloat16, 192, 0.253, 0.247, 0.174, 0.167},
    {Family::kFp8, DType::kFloat16, 256, 0.195, 0.19, 0.144, 0.139},
    {Family::kTc, DType::kBFloat16, 64, 0.141, 0.131, 0.12, 0.11},
    {Family::kTc, DType::kBFloat16, 80, 0.206, 0.198, 0.184, 0.176},
    {Family::kTc, DType::kBFloat16, 96, 0.172, 0.165, 0.148, 0.141},
    {Family::kTc, DType::kBFloat16, 112, 0.155, 0.149, 0.138, 0.131},
    {Family::kTc, DType::kBFloat16, 128, 0.123, 0.118, 0.107, 0.103},
    {Family::kTc, DType::kBFloat16, 192, 0.184, 0.178, 0.154, 0.148},
    {Family::kTc, DType::kBFloat16, 256, 0.138, 0.133, 0.12, 0.115},
    {Family::kTc, DType::kFloat16, 64, 0.142, 0.132, 0.12, 0.11},
    {Family::kTc, DType::kFloat16, 80, 0.207, 0.199, 0.184, 0.177},
    {Family::kTc, DType::kFloat16, 96, 0.173, 0.166, 0.148, 0.142},
    {Family::kTc, DType::kFloat16, 112, 0.155, 0.15, 0.138, 0.132},
    {Family::kTc, DType::kFloat16, 128, 0.124, 0.119, 0.108, 0.103},
    {Family::kTc, DType::kFloat16, 192, 0.185, 0.178, 0.155, 0.148},
    {Family::kTc, DType::kFloat16, 256, 0.138, 0.133, 0.12, 0.115},
};

// Warp-instructions per warp outside the main loop (prologue + epilogue beyond the peeled last tile):
// issue 31's SASS reading of bf16 head 128 TensorCoreMath (~880 + ~550, 16 IEEE divisions per lane
// among them), taken for every pass-1 kernel until the static report carries per-row prologue_instr
// and epilogue_instr (scripts/kernel_report.py) and a GPU measures the fixed phase (block_latency_us's
// note).
constexpr double kOutsideInstrPerWarp = 880 + 550;

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
    if (r.family == f && r.q == q && r.d == head_size)
      return {true, r.vllm, r.vllm_nocap, r.nhd, r.nhd_nocap, kOutsideInstrPerWarp};
  return {};
}

Pass1Issue pass1_issue(const AttentionSpec& spec, int q_len, int num_sms, const CostConstants& k) {
  const int elem = static_cast<int>(spec.kv_elem_size());
  const bool tc = kernels::pass1_uses_tensor_cores(elem, kernels::pass1_rows(spec.group_size(), q_len));
  Pass1Issue r;
  r.warps = (kernels::pass1_resources(spec, q_len).threads + 31) / 32;
  r.num_sms = std::max(1, num_sms);
  const Pass1InstrRow row = pass1_instr_row(spec.dtype, elem == 1, tc, spec.head_size);
  if (row.found) {
    const bool nhd = spec.layout == KVLayout::kNHD, cap = spec.logit_softcap > 0;
    const double at4 = nhd ? (cap ? row.per_byte_nhd : row.per_byte_nhd_nocap)
                           : (cap ? row.per_byte_vllm : row.per_byte_vllm_nocap);
    r.loop_instr_per_byte = tc ? at4 : at4 * r.warps / 4.0;
    r.outside_instr = row.outside_per_warp;
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
  const Pass1Issue issue = pass1_issue(s, p.q_len, c.device_model.num_sms, k);
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
