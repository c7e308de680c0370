// The cost model (docs/planning.md, "The cost model"). Pass 1 is a fluid model of its blocks
// moving through the resident slots in launch order: every streaming block gets the same share of
// the roof, capped at what one block streams alone, so a full wave runs at the roof while a partial
// last wave of a few blocks runs at their own rate. Blocks of one kind run in whole waves (closed
// form); with two kinds (a row's full partitions and its shorter last one), blocks with the same
// work that start together finish together, so the simulation steps from one such group
// ("cohort") to the next, a handful of events per wave. The merge is its latency chain (L2 round trips of its folds) or its
// partials' bandwidth, whichever is longer. Each kernel adds a floor and a launch gap.
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

struct Cohort {
  long long count;
  bool streaming;  // false: in its fixed phase, ending at `end` (time); true: ending at `end` (offset)
  double end;
  double bytes;    // to stream after the fixed phase
};

}  // namespace

double simulate_waves(long long rows, int grid_x, int full, double full_bytes, int tail, double tail_bytes,
                      long long slots, const CostConstants& k) {
  if (rows <= 0 || grid_x <= 0 || slots <= 0) return 0;
  const double block_rate = k.block_gbs * kBytesPerUsPerGbs;  // bytes per us
  const double roof = k.read_gbs * kBytesPerUsPerGbs;
  // Idle blocks (past their row's length) hold a slot only to read the length and exit: their slot
  // time, spread over the slots, is added instead of simulated (they would only stagger the others).
  const long long idle = rows * (grid_x - full - tail);
  const double idle_us = static_cast<double>(idle) * k.idle_block_us / static_cast<double>(slots);
  if (tail == 0 || full == 0 || tail_bytes == full_bytes) {
    // One kind of block: every wave starts together and ends together.
    const long long n = rows * (full + tail);
    const double bytes = full > 0 ? full_bytes : tail_bytes;
    auto wave = [&](long long c) { return k.block_fixed_us + bytes / std::min(block_rate, roof / static_cast<double>(c)); };
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
  const double slot_rate = std::min(block_rate, roof / static_cast<double>(std::min(slots, total)));
  const double quantum = 0.03 * (k.block_fixed_us + std::max(full_bytes, tail_bytes) / slot_rate);

  std::vector<Cohort> cohorts, kept;
  double t = 0, off = 0;  // time; bytes every streaming block has streamed since t = 0
  long long next = 0, resident = 0, streaming = 0;
  for (int guard = 0; guard < 1000000; ++guard) {
    if (next < total && resident < slots) {
      const long long take = std::min(slots - resident, total - next);
      for (int cls = 0; cls < 2; ++cls) {
        const long long n = before(next + take, cls) - before(next, cls);
        if (n > 0) cohorts.push_back({n, false, t + k.block_fixed_us, class_bytes[cls]});
      }
      resident += take;
      next += take;
    }
    if (cohorts.empty()) break;
    const double rate = streaming > 0 ? std::min(block_rate, roof / static_cast<double>(streaming)) : 0;
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
  const double resident = static_cast<double>(c.device_model.num_sms) * merge_blocks_per_sm(threads, k);
  const double waves = std::ceil(blocks / resident);
  const double chain = waves * (rounds * k.l2_round_trip_us + k.merge_tree_us);
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
  int n = 1;
  if (v2) {
    const int P = p.partition_size;
    n = num_partitions(len, P);
    const int last = len - (n - 1) * P;
    const double written = rows_per_block * partial_row;
    r.pass1_us = simulate_waves(rows, p.grid_x, n - 1, P * kv_token + written, 1, last * kv_token + written, slots, k);
    r.merge_us = merge_us(c, p, n, k);
    r.fixed_us = 2 * (k.kernel_floor_us + k.launch_gap_us);
  } else {
    r.pass1_us = simulate_waves(rows, 1, 0, 0, 1, len * kv_token, slots, k);
    r.fixed_us = k.kernel_floor_us + k.launch_gap_us;
  }
  r.us = r.pass1_us + r.merge_us + r.fixed_us;
  const double qo_row = static_cast<double>(s.num_q_heads) * s.head_size * esize;
  r.bytes = static_cast<double>(p.batch) * (static_cast<double>(len) * s.num_kv_heads * kv_token + 2 * q_rows * qo_row);
  if (v2) r.bytes += 2.0 * p.batch * q_rows * s.num_q_heads * partial_row * n;
  r.roof_share = r.bytes / (r.us * k.read_gbs * kBytesPerUsPerGbs);
  return r;
}

}  // namespace decodegraph::detail
