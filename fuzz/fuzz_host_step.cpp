// libFuzzer target (b): the host backend's step, and the eager host V1/V2 calls, on small shapes.
// The input picks a valid small spec and executor config (kFull or kCheap), then up to four steps
// whose inputs are mostly valid (random lengths, block tables shared between sequences, the slot of
// each last position or a skip, batch sizes, sometimes a max_seq_len hint, sometimes written into
// host_staging(), sometimes a padded row: length 0, slot -1) with the occasional bad value. Each step must either throw decodegraph::Error or
// produce outputs that match the float64 reference; the eager host V1 and V2 on the same inputs must
// match it too. Under kCheap a bad block id runs, clamped as the kernels clamp it (the reference
// over the clamped table is the oracle), and check_errors() must then report it.
//
// Work per input is bounded (kMaxWork, kMaxCacheElems, the kMeasured rule below) so that CI's 30 s
// run thousands of inputs. The host attention, the float64 reference, kMeasured's candidate runs and
// the filling of the caches were the whole cost (perf over the seed corpus before issue 39: 0.2-1.2 s
// an input of up to 8 sequences x 600 tokens x 8 heads x 128, 3-8 inputs a second; now 100-200,
// docs/reliability.md "Speed"). Which paths an input reaches follows the shape's kind (dtype, layout,
// head size, GQA group, block size, bands, partitions, policy), not its magnitude.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_common.hpp"

using namespace dgfuzz;

namespace {

// Elements of the q.k and p.v products of one attention call over a step's lengths, at most
// max_batch x len_cap x num_q_heads x head_size x num_layers: each step's lengths are drawn from
// 1..len_cap, len_cap = kMaxWork / (max_batch x num_q_heads x head_size x num_layers) (at least 1,
// at most max_seq_len). 600 x 64: every length up to 600 at one sequence of one head of 64 in one
// layer (as before the bound, for any shape), 75 tokens at 4 heads of 128 (multi-partition V2 on
// the tensor-core path), 9 tokens at 8 sequences of 4 heads of 128. The configuration itself
// (max_seq_len up to 600, bands, threshold, partitions: the plans) is drawn as before. It keeps an
// input at a few milliseconds: the host attention runs ~4 times per layer and step (the step, host
// V1, host V2, the reference), under ASan, UBSan and coverage.
constexpr long long kMaxWork = 600 * 64;
// Elements of one layer's K (or V) cache, num_blocks x block_elems(); num_blocks is drawn up to what
// this allows (at most 64, as before; at least 1). 64 x 512: all 64 blocks at the smallest block
// (8 tokens x 1 KV head x 64). Filling 4 caches of up to 64 x 8192 elements took most of the time of
// a small input.
constexpr long long kMaxCacheElems = 64 * 512;

// splitmix64: a cheap generator for the data (std::uniform_real_distribution's generate_canonical
// calls logl twice per value; it was a tenth of the run).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float amp) { return (static_cast<float>(next() >> 40) * 0x1p-23f - 1.0f) * amp; }  // [-amp, amp)
};

// Uniform values in [-amp, amp), rounded to dt; the dtype's switch outside the loop.
void fill(DType dt, void* p, std::size_t n, Rng& rng, float amp) {
  switch (dt) {
    case DType::kFloat16:
      for (std::size_t i = 0; i < n; ++i) static_cast<uint16_t*>(p)[i] = float_to_fp16_bits(rng.uniform(amp));
      break;
    case DType::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(rng.uniform(amp));
      break;
    case DType::kFloat32:
      for (std::size_t i = 0; i < n; ++i) static_cast<float*>(p)[i] = rng.uniform(amp);
      break;
  }
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
  const long long per_token = static_cast<long long>(c.max_batch) * c.spec.num_q_heads * c.spec.head_size * c.num_layers;
  const int len_cap = static_cast<int>(std::clamp<long long>(kMaxWork / per_token, 1, c.max_seq_len));
  c.v2_threshold = fdp.ConsumeIntegralInRange(1, c.max_seq_len);
  const int bs = c.spec.block_size;
  const int need = (c.max_seq_len + bs - 1) / bs;
  c.max_blocks_per_seq = need + fdp.ConsumeIntegralInRange(0, 2);
  const long long block_elems = static_cast<long long>(c.spec.block_elems());
  c.num_blocks = fdp.ConsumeIntegralInRange(1, static_cast<int>(std::clamp(kMaxCacheElems / block_elems, 1LL, 64LL)));
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
  c.measure_replays = 1;
  c.capture = fdp.ConsumeBool() ? CapturePolicy::kLazy : CapturePolicy::kUpFront;
  // kMeasured times candidates by running CPU attention, under kDevice for every band of a bucket on
  // its first step (kUpFront: of every bucket, at construction), on lengths in the middle of each
  // band, not the step's: up to 4 candidates x 2 replays x layers host attention calls per (bucket,
  // band). Keep it to configs whose longest length fits the work bound and to at most 8 measured
  // (bucket, band) cells x layers, so that measuring stays a few times one step's work.
  if (c.policy == KernelPolicy::kMeasured) {
    const std::size_t bands = c.band_edges.empty() ? default_band_edges(c.max_seq_len, c.v2_threshold).size()
                                                   : c.band_edges.size();
    const std::size_t buckets = default_batch_buckets(c.max_batch).size();  // at most 4: 1, 2, 4, 8
    if (len_cap < c.max_seq_len || buckets * bands * c.num_layers > 8) c.policy = KernelPolicy::kAuto;
  }
  c.backend = BackendKind::kHost;
  const bool cheap = fdp.ConsumeBool();
  c.validation = cheap ? ValidationLevel::kCheap : ValidationLevel::kFull;
  c.append_kv = fdp.ConsumeBool();
  c.log_level = "off";
  const bool alibi = fdp.ConsumeBool();
  if (alibi)
    for (int h = 0; h < c.spec.num_q_heads; ++h) c.alibi_slopes.push_back(0.5f / (h + 1));
  Rng rng{fdp.ConsumeIntegral<uint32_t>()};
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
    for (auto& len : lens) len = fdp.ConsumeIntegralInRange(1, len_cap);
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
      const std::vector<double> ref = reference_of(a);  // the same for the step, V1 and V2
      check_against_reference(a, ref, ex->output(l), amp, "executor step output differs from the reference");

      // The eager host calls over the same arguments.
      Storage out(static_cast<std::size_t>(n) * row * es);
      a.out = out.data();
      a.host_seq_lens = lens.data();
      a.host_block_tables = tables.data();
      host::paged_attention_v1(a);
      check_against_reference(a, ref, out.data(), amp, "host V1 differs from the reference");
      const int part = bs * fdp.ConsumeIntegralInRange(1, 8);
      const std::size_t ws_bytes = v2_workspace_size(c.spec, n, a.max_seq_len, part);
      Storage ws(ws_bytes);
      host::paged_attention_v2(a, part, ws.data(), ws_bytes);
      check_against_reference(a, ref, out.data(), amp, "host V2 differs from the reference");
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
