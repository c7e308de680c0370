// libFuzzer target (b): the host backend's step, and the eager host V1/V2 calls, on small shapes.
// The input picks a valid small spec and executor config (kFull or kCheap), then up to four steps
// whose inputs are mostly valid (random lengths, block tables shared between sequences, the slot of
// each last position or a skip, batch sizes, sometimes a max_seq_len hint, sometimes written into
// host_staging(), sometimes a padded row: length 0, slot -1) with the occasional bad value. Each step must either throw decodegraph::Error or
// produce outputs that match the float64 reference; the eager host V1 and V2 on the same inputs must
// match it too. Under kCheap a bad block id runs, clamped as the kernels clamp it (the reference
// over the clamped table is the oracle), and check_errors() must then report it.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "fuzz_common.hpp"

using namespace dgfuzz;

namespace {

void fill(DType dt, void* p, std::size_t n, std::mt19937& rng, float amp) {
  std::uniform_real_distribution<float> d(-amp, amp);
  for (std::size_t i = 0; i < n; ++i) store_from_float(dt, p, i, d(rng));
}

void run(FuzzedDataProvider& fdp) {
  ExecutorConfig c;
  const int head_sizes[] = {64, 80, 128};
  const int block_sizes[] = {8, 16, 32};
  c.spec.head_size = head_sizes[fdp.ConsumeIntegralInRange(0, 2)];
  c.spec.block_size = block_sizes[fdp.ConsumeIntegralInRange(0, 2)];
  c.spec.num_kv_heads = fdp.ConsumeIntegralInRange(1, 2);
  c.spec.num_q_heads = c.spec.num_kv_heads * fdp.ConsumeIntegralInRange(1, 4);
  c.spec.dtype = static_cast<DType>(fdp.ConsumeIntegralInRange(0, 2));
  c.spec.layout = static_cast<KVLayout>(fdp.ConsumeIntegralInRange(0, 1));
  // 0 = 1/sqrt(head_size); explicit scales up to 0.25 keep logits within what fp32 resolves finely.
  c.spec.scale = fdp.ConsumeBool() ? 0.0f : fdp.ConsumeFloatingPointInRange(0.01f, 0.25f);
  c.num_layers = fdp.ConsumeIntegralInRange(1, 2);
  c.max_batch = fdp.ConsumeIntegralInRange(1, 8);
  c.max_seq_len = fdp.ConsumeIntegralInRange(1, 600);
  c.v2_threshold = fdp.ConsumeIntegralInRange(1, c.max_seq_len);
  const int bs = c.spec.block_size;
  const int need = (c.max_seq_len + bs - 1) / bs;
  c.max_blocks_per_seq = need + fdp.ConsumeIntegralInRange(0, 2);
  c.num_blocks = fdp.ConsumeIntegralInRange(1, 64);
  if (fdp.ConsumeBool()) {  // random increasing edges containing the threshold and max_seq_len
    std::vector<int> e{c.max_seq_len};
    if (c.v2_threshold < c.max_seq_len) e.push_back(c.v2_threshold);
    const int extra = fdp.ConsumeIntegralInRange(0, 4);
    for (int i = 0; i < extra; ++i) e.push_back(fdp.ConsumeIntegralInRange(1, c.max_seq_len));
    std::sort(e.begin(), e.end());
    e.erase(std::unique(e.begin(), e.end()), e.end());
    c.band_edges = e;
  }
  c.partition_size = fdp.ConsumeBool() ? 0 : bs * fdp.ConsumeIntegralInRange(1, 16);
  c.device_model.num_sms = fdp.ConsumeIntegralInRange(0, 140);
  c.policy = static_cast<KernelPolicy>(fdp.ConsumeIntegralInRange(0, 2));
  // kMeasured times candidates by running CPU attention, under kDevice for every band of a bucket on
  // its first step: keep it to small configs, so one input stays far below libFuzzer's timeout.
  if (c.policy == KernelPolicy::kMeasured && c.max_batch * c.max_seq_len * c.num_layers > 1200)
    c.policy = KernelPolicy::kAuto;
  c.measure_replays = 1;
  c.capture = fdp.ConsumeBool() ? CapturePolicy::kLazy : CapturePolicy::kUpFront;
  c.backend = BackendKind::kHost;
  const bool cheap = fdp.ConsumeBool();
  c.validation = cheap ? ValidationLevel::kCheap : ValidationLevel::kFull;
  c.append_kv = fdp.ConsumeBool();
  c.log_level = "off";
  const bool alibi = fdp.ConsumeBool();
  if (alibi)
    for (int h = 0; h < c.spec.num_q_heads; ++h) c.alibi_slopes.push_back(0.5f / (h + 1));
  std::mt19937 rng(fdp.ConsumeIntegral<uint32_t>());
  const float amp = fdp.ConsumeBool() ? 1.0f : 8.0f;  // 8: large logits stress the max subtraction

  const DType dt = c.spec.dtype;
  const std::size_t es = dtype_size(dt);
  const std::size_t cache_elems = static_cast<std::size_t>(c.num_blocks) * c.spec.block_elems();
  std::vector<Storage> caches;
  for (int l = 0; l < 2 * c.num_layers; ++l) {
    caches.emplace_back(cache_elems * es);
    fill(dt, caches.back().data(), cache_elems, rng, amp);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    c.layers.push_back(LayerBuffers{caches[2 * l].data(), caches[2 * l + 1].data()});
    c.layers.back().k_cache_bytes = c.layers.back().v_cache_bytes = cache_elems * es;  // the host backend needs them
  }

  std::unique_ptr<Executor> ex;
  try {
    ex = std::make_unique<Executor>(c);
  } catch (const Error&) {
    return;
  }
  const std::size_t row = static_cast<std::size_t>(c.spec.num_q_heads) * c.spec.head_size;
  const std::size_t kv_row = static_cast<std::size_t>(c.spec.num_kv_heads) * c.spec.head_size;
  const int stride = ex->config().max_blocks_per_seq;

  const int steps = fdp.ConsumeIntegralInRange(1, 4);
  for (int s = 0; s < steps; ++s) {
    const bool bad = fdp.ConsumeIntegralInRange(0, 7) == 0;
    const int n = bad ? fdp.ConsumeIntegralInRange(-1, c.max_batch + 1) : fdp.ConsumeIntegralInRange(1, c.max_batch);
    const int rows = std::max(n, 0);
    std::vector<int32_t> lens(rows), tables(static_cast<std::size_t>(rows) * stride);
    std::vector<int64_t> slots(rows);
    for (auto& len : lens) len = fdp.ConsumeIntegralInRange(1, c.max_seq_len);
    for (auto& id : tables) id = fdp.ConsumeIntegralInRange(0, c.num_blocks - 1);
    for (int i = 0; i < rows; ++i) {  // the slot of position seq_len - 1, or a skip
      const int pos = lens[i] - 1;
      slots[i] = fdp.ConsumeIntegralInRange(0, 7) == 0
                     ? -1
                     : int64_t{tables[static_cast<std::size_t>(i) * stride + pos / bs]} * bs + pos % bs;
    }
    bool bad_id = false;
    if (bad && rows > 0) {  // one out-of-range value somewhere
      const int i = fdp.ConsumeIntegralInRange(0, rows - 1);
      switch (fdp.ConsumeIntegralInRange(0, 4)) {
        case 0:  // a padded row (valid with a -1 slot, rejected with its old one) or a length too long
          if (fdp.ConsumeBool()) {
            lens[i] = 0;
            if (fdp.ConsumeBool()) slots[i] = -1;
          } else {
            lens[i] = c.max_seq_len + 1;
          }
          break;
        case 1:
          tables[static_cast<std::size_t>(i) * stride] = fdp.ConsumeBool() ? -1 : c.num_blocks;
          bad_id = true;
          break;
        case 2: slots[i] = int64_t{c.num_blocks} * bs; break;
        case 3: if (slots[i] >= 0) slots[i] += lens[i] % bs == 0 ? -1 : 1; break;  // a neighbouring position
        default: break;
      }
    }
    for (int l = 0; l < c.num_layers; ++l) {
      fill(dt, ex->query(l), c.max_batch * row, rng, amp);
      fill(dt, ex->new_key(l), c.max_batch * kv_row, rng, amp);
      fill(dt, ex->new_value(l), c.max_batch * kv_row, rng, amp);
    }
    StepInputs in;
    in.num_seqs = n;
    in.seq_lens = lens.data();
    in.block_tables = tables.data();
    in.block_table_stride = stride;
    in.slot_mapping = slots.data();
    const int longest = rows > 0 ? *std::max_element(lens.begin(), lens.end()) : 0;
    bool bad_hint = false;
    switch (fdp.ConsumeIntegralInRange(0, 3)) {
      case 1:  // a hint at or above every length
        in.max_seq_len = std::min(c.max_seq_len, longest + fdp.ConsumeIntegralInRange(0, 64));
        break;
      case 2:  // a hint below a length: host lengths are always checked against it
        in.max_seq_len = longest - 1;
        bad_hint = longest > 1;
        break;
      default: break;
    }
    if (rows > 0 && rows <= c.max_batch && fdp.ConsumeBool()) {  // written into the staging buffers
      const HostStaging h = ex->host_staging();
      std::copy(lens.begin(), lens.end(), h.seq_lens.begin());
      std::copy(tables.begin(), tables.end(), h.block_tables.begin());
      std::copy(slots.begin(), slots.end(), h.slot_mapping.begin());
      in.seq_lens = h.seq_lens.data();
      in.block_tables = h.block_tables.data();
      in.slot_mapping = h.slot_mapping.data();
    }
    try {
      ex->step(in);
    } catch (const Error&) {
      continue;
    }
    check(!bad_hint, "a max_seq_len hint below a host length was accepted", in.max_seq_len, longest);
    check(!bad_id || cheap, "kFull accepted a bad block id");
    // Shared blocks: a later sequence's append may overwrite what an earlier one appended, so only
    // the attention is checked here, against the cache as it is now. Under kCheap a bad id reads a
    // block clamped into [0, num_blocks), so the oracle is the reference over the clamped table.
    if (bad_id) {
      for (auto& id : tables) id = std::clamp(id, 0, c.num_blocks - 1);
      bool reported = false;
      try {
        ex->check_errors();
      } catch (const InvalidArgument&) {
        reported = true;
      }
      check(reported, "kCheap: a bad block id was not reported by check_errors()");
    }
    for (int l = 0; l < c.num_layers; ++l) {
      DecodeArgs a;
      a.spec = c.spec;
      a.num_seqs = n;
      a.max_seq_len = std::max(longest, 1);  // every row padded: the eager calls still want a bound
      a.block_table_stride = stride;
      a.num_blocks = c.num_blocks;
      a.q = ex->query(l);
      a.out = ex->output(l);
      a.k_cache = caches[2 * l].data();
      a.v_cache = caches[2 * l + 1].data();
      a.block_tables = tables.data();
      a.seq_lens = lens.data();
      a.alibi_slopes = alibi ? c.alibi_slopes.data() : nullptr;
      check_against_reference(a, ex->output(l), amp, "executor step output differs from the reference");

      // The eager host calls over the same arguments.
      Storage out(static_cast<std::size_t>(n) * row * es);
      a.out = out.data();
      a.host_seq_lens = lens.data();
      a.host_block_tables = tables.data();
      host::paged_attention_v1(a);
      check_against_reference(a, out.data(), amp, "host V1 differs from the reference");
      const int part = bs * fdp.ConsumeIntegralInRange(1, 8);
      const std::size_t ws_bytes = v2_workspace_size(c.spec, n, a.max_seq_len, part);
      Storage ws(ws_bytes);
      host::paged_attention_v2(a, part, ws.data(), ws_bytes);
      check_against_reference(a, out.data(), amp, "host V2 differs from the reference");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  try {
    run(fdp);
  } catch (const Error&) {
  }
  return 0;
}
