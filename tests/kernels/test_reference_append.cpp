// The float64 reference checked against dense attention over unpaged K/V, and host append_kv
// checked slot by slot against the layouts as documented in types.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "problem.hpp"

namespace {

using namespace dgtest;
using decodegraph::AppendArgs;

// Element offsets written straight from the shape comments in types.hpp (test-local on purpose).
int64_t doc_k_offset(const AttentionSpec& s, int64_t blk, int h, int t, int d) {
  const int64_t H = s.num_kv_heads, D = s.head_size, B = s.block_size;
  if (s.layout == KVLayout::kNHD) return blk * B * H * D + t * H * D + h * D + d;
  const int64_t x = 16 / static_cast<int64_t>(decodegraph::dtype_size(s.dtype));
  return blk * H * (D / x) * B * x + h * (D / x) * B * x + (d / x) * B * x + t * x + d % x;
}
int64_t doc_v_offset(const AttentionSpec& s, int64_t blk, int h, int t, int d) {
  const int64_t H = s.num_kv_heads, D = s.head_size, B = s.block_size;
  if (s.layout == KVLayout::kNHD) return blk * B * H * D + t * H * D + h * D + d;
  return blk * H * D * B + h * D * B + d * B + t;
}

/// The caches after appending `tokens` rows of `heads` heads from key / value at `slots` (negative:
/// skipped), written into copies of kc / vc element by element from the documented offsets.
struct ExpectedCaches {
  std::vector<unsigned char> k, v;
};
ExpectedCaches expected_append(const AttentionSpec& s, const Buffer& kc, const Buffer& vc, const Buffer& key,
                               const Buffer& value, const std::vector<int64_t>& slots, int tokens, int heads) {
  const std::size_t esz = decodegraph::dtype_size(s.dtype);
  ExpectedCaches e{std::vector<unsigned char>(kc.bytes), std::vector<unsigned char>(vc.bytes)};
  std::memcpy(e.k.data(), kc.data(), kc.bytes);
  std::memcpy(e.v.data(), vc.data(), vc.bytes);
  for (int t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    const int64_t blk = slots[t] / s.block_size;
    const int off = static_cast<int>(slots[t] % s.block_size);
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < s.head_size; ++d) {
        const std::size_t src = (static_cast<std::size_t>(t) * heads + h) * s.head_size + d;
        std::memcpy(&e.k[doc_k_offset(s, blk, h, off, d) * esz],
                    static_cast<const unsigned char*>(key.data()) + src * esz, esz);
        std::memcpy(&e.v[doc_v_offset(s, blk, h, off, d) * esz],
                    static_cast<const unsigned char*>(value.data()) + src * esz, esz);
      }
  }
  return e;
}

struct AppendCase {
  DType dtype;
  KVLayout layout;
  int head_size, block_size;
};

class AppendAndReference : public ::testing::TestWithParam<AppendCase> {};

// Appends random tokens at random distinct slots (some skipped with -1) and compares whole caches
// with an expected copy built from the documented layout.
TEST_P(AppendAndReference, AppendWritesExactlyTheGivenSlots) {
  const AppendCase& c = GetParam();
  AttentionSpec s;
  s.dtype = c.dtype;
  s.layout = c.layout;
  s.head_size = c.head_size;
  s.block_size = c.block_size;
  s.num_kv_heads = 3;
  s.num_q_heads = 3;
  const int num_blocks = 9, num_tokens = 40;
  const std::size_t cache_elems = num_blocks * s.block_elems();
  const std::size_t tok_elems = static_cast<std::size_t>(num_tokens) * 3 * s.head_size;

  std::mt19937_64 rng(c.head_size * 31 + c.block_size);
  Buffer kc = make_buffer(s.dtype, cache_elems), vc = make_buffer(s.dtype, cache_elems);
  Buffer key = make_buffer(s.dtype, tok_elems), value = make_buffer(s.dtype, tok_elems);
  fill_uniform(s.dtype, kc.data(), cache_elems, rng);
  fill_uniform(s.dtype, vc.data(), cache_elems, rng);
  fill_uniform(s.dtype, key.data(), tok_elems, rng, 2.f, 3.f);  // distinct from the cache's values
  fill_uniform(s.dtype, value.data(), tok_elems, rng, -3.f, -2.f);

  std::vector<int64_t> slots(num_blocks * s.block_size);
  for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(num_tokens);
  slots[3] = -1;
  slots[17] = -1;

  const ExpectedCaches want = expected_append(s, kc, vc, key, value, slots, num_tokens, 3);

  AppendArgs a;
  a.spec = s;
  a.num_tokens = num_tokens;
  a.num_blocks = num_blocks;
  a.key = key.data();
  a.value = value.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.slot_mapping = slots.data();
  decodegraph::host::append_kv(a);
  EXPECT_EQ(std::memcmp(kc.data(), want.k.data(), kc.bytes), 0) << "K cache";
  EXPECT_EQ(std::memcmp(vc.data(), want.v.data(), vc.bytes), 0) << "V cache";

  // An out-of-range slot anywhere is rejected before anything is written.
  std::vector<int64_t> bad = slots;
  bad[num_tokens - 1] = static_cast<int64_t>(num_blocks) * s.block_size;
  a.slot_mapping = bad.data();
  fill_uniform(s.dtype, key.data(), tok_elems, rng, 4.f, 5.f);
  try {
    decodegraph::host::append_kv(a);
    ADD_FAILURE() << "no error";
  } catch (const decodegraph::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("slot_mapping[39] = " + std::to_string(num_blocks * s.block_size)),
              std::string::npos) << m;
  }
  EXPECT_EQ(std::memcmp(kc.data(), want.k.data(), kc.bytes), 0) << "K cache after rejection";
}

// Fills a paged cache through host append_kv from dense K/V [len, kv_heads, head_size], then checks
// the reference (and host V1) against dense attention over the unpaged arrays: this pins the
// reference's layout indexing, scale and ALiBi to the documented semantics.
TEST_P(AppendAndReference, ReferenceMatchesDenseAttention) {
  const AppendCase& c = GetParam();
  AttentionSpec s;
  s.dtype = c.dtype;
  s.layout = c.layout;
  s.head_size = c.head_size;
  s.block_size = c.block_size;
  s.num_kv_heads = 2;
  s.num_q_heads = 6;
  s.scale = (c.head_size % 3 == 0) ? 0.2f : 0.0f;
  const int len = 3 * c.block_size + 5, H = 2, D = c.head_size, QH = 6;
  const int nblk = (len + c.block_size - 1) / c.block_size;
  const int num_blocks = nblk + 4;
  std::mt19937_64 rng(len + D);

  const std::size_t dense = static_cast<std::size_t>(len) * H * D;
  Buffer key = make_buffer(s.dtype, dense), value = make_buffer(s.dtype, dense);
  Buffer q = make_buffer(s.dtype, QH * D), out = make_buffer(s.dtype, QH * D);
  fill_uniform(s.dtype, key.data(), dense, rng, -2.f, 2.f);
  fill_uniform(s.dtype, value.data(), dense, rng);
  fill_uniform(s.dtype, q.data(), QH * D, rng, -2.f, 2.f);
  Buffer kc = make_buffer(s.dtype, num_blocks * s.block_elems());
  Buffer vc = make_buffer(s.dtype, num_blocks * s.block_elems());
  poison(s.dtype, kc.data(), num_blocks * s.block_elems());
  poison(s.dtype, vc.data(), num_blocks * s.block_elems());

  // Blocks in reverse order with gaps: table[j] = num_blocks - 1 - j.
  std::vector<int32_t> table(nblk);
  std::vector<int64_t> slots(len);
  for (int j = 0; j < nblk; ++j) table[j] = num_blocks - 1 - j;
  for (int t = 0; t < len; ++t)
    slots[t] = static_cast<int64_t>(table[t / c.block_size]) * c.block_size + t % c.block_size;
  AppendArgs ap;
  ap.spec = s;
  ap.num_tokens = len;
  ap.num_blocks = num_blocks;
  ap.key = key.data();
  ap.value = value.data();
  ap.k_cache = kc.data();
  ap.v_cache = vc.data();
  ap.slot_mapping = slots.data();
  decodegraph::host::append_kv(ap);

  const std::vector<float> slopes = alibi_slopes(QH);
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(D));
  std::vector<double> expect(QH * D, 0.0);
  auto ld = [&](const Buffer& b, std::size_t i) { return double(decodegraph::load_as_float(s.dtype, b.data(), i)); };
  for (int h = 0; h < QH; ++h) {
    const int kvh = h / 3;
    std::vector<double> w(len);
    double mx = -INFINITY, sum = 0;
    for (int t = 0; t < len; ++t) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += ld(q, h * D + d) * ld(key, (t * H + kvh) * D + d);
      w[t] = dot * scale + double(slopes[h]) * (t - len + 1);
      mx = std::max(mx, w[t]);
    }
    for (int t = 0; t < len; ++t) sum += (w[t] = std::exp(w[t] - mx));
    for (int t = 0; t < len; ++t)
      for (int d = 0; d < D; ++d) expect[h * D + d] += w[t] / sum * ld(value, (t * H + kvh) * D + d);
  }

  const int32_t seq_len = len;
  decodegraph::DecodeArgs a;
  a.spec = s;
  a.num_seqs = 1;
  a.max_seq_len = len;
  a.block_table_stride = nblk;
  a.num_blocks = num_blocks;
  a.q = q.data();
  a.out = out.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.block_tables = table.data();
  a.seq_lens = &seq_len;
  a.alibi_slopes = slopes.data();
  std::vector<double> ref(QH * D);
  decodegraph::reference::paged_attention(a, ref.data());
  for (int i = 0; i < QH * D; ++i) ASSERT_NEAR(ref[i], expect[i], 1e-12) << i;

  poison(s.dtype, out.data(), QH * D);
  decodegraph::host::paged_attention_v1(a);
  const Tolerance tol = tolerance(s.dtype);
  EXPECT_TRUE(check_close(s.dtype, out.data(), expect.data(), 1, QH, D, tol.atol, tol.rtol));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, AppendAndReference,
    ::testing::Values(AppendCase{DType::kFloat16, KVLayout::kVLLM, 64, 16},
                      AppendCase{DType::kFloat16, KVLayout::kNHD, 80, 8},
                      AppendCase{DType::kBFloat16, KVLayout::kVLLM, 192, 32},
                      AppendCase{DType::kBFloat16, KVLayout::kNHD, 96, 16},
                      AppendCase{DType::kFloat32, KVLayout::kVLLM, 112, 8},
                      AppendCase{DType::kFloat32, KVLayout::kNHD, 256, 32},
                      AppendCase{DType::kFloat32, KVLayout::kVLLM, 128, 16}),
    [](const ::testing::TestParamInfo<AppendCase>& i) {
      return std::string(decodegraph::to_string(i.param.dtype)) + "_" +
             decodegraph::to_string(i.param.layout) + "_d" + std::to_string(i.param.head_size) +
             "_b" + std::to_string(i.param.block_size);
    });

TEST(Reference, PaddedRowsUntouchedAndConstantValues) {
  ProblemSpec ps;
  ps.spec.dtype = DType::kFloat32;
  ps.lens = {0, 37, 0};
  auto p = make_problem(ps);
  // Make every V element 0.75: any softmax then yields exactly 0.75.
  auto* v = static_cast<float*>(p->v.data());
  for (std::size_t i = 0; i < p->args.num_blocks * ps.spec.block_elems(); ++i) v[i] = 0.75f;
  std::vector<double> ref(p->out_elems, -123.0);
  p->args.out = nullptr;  // the reference writes only out64
  decodegraph::reference::paged_attention(p->args, ref.data());
  const std::size_t row = static_cast<std::size_t>(ps.spec.num_q_heads) * ps.spec.head_size;
  for (std::size_t i = 0; i < row; ++i) {
    ASSERT_EQ(ref[i], -123.0);
    ASSERT_NEAR(ref[row + i], 0.75, 1e-12);
    ASSERT_EQ(ref[2 * row + i], -123.0);
  }
}

}  // namespace

namespace {

// host::append_kv with the sequences' lengths and block tables checks every slot against the slot
// of position seq_len - 1 before writing anything: the off-by-one slot, lengths that do not count
// the new token and a bad block id at the position are rejected naming the entry; without tables
// only the cache bound is checked (the vLLM call, as before). Argument rules for the check itself.
TEST(AppendSlotCheck, HostAppendRejectsASlotNotAtItsPosition) {
  const AttentionSpec s{4, 2, 64, 16, DType::kFloat32, KVLayout::kNHD};
  const int num_blocks = 8, tokens = 2, stride = 4;
  const std::size_t cache = static_cast<std::size_t>(num_blocks) * s.block_elems();
  std::vector<float> kc(cache, 1.f), vc(cache, 2.f), key(tokens * 2 * 64, 3.f), value(tokens * 2 * 64, 4.f);
  std::vector<int32_t> lens = {20, 5}, tables = {3, 5, 0, 0, 6, 0, 0, 0};
  std::vector<int64_t> slots = {5 * 16 + 3, 6 * 16 + 4};  // positions 19 and 4: right
  AppendArgs a;
  a.spec = s;
  a.num_tokens = tokens;
  a.num_blocks = num_blocks;
  a.key = key.data();
  a.value = value.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.slot_mapping = slots.data();
  a.seq_lens = lens.data();
  a.block_tables = tables.data();
  a.block_table_stride = stride;
  EXPECT_NO_THROW(decodegraph::host::append_kv(a));
  const std::vector<float> written = kc;

  slots[0] = 5 * 16 + 4;  // position 20 = seq_len
  dgtest::expect_error([&] { decodegraph::host::append_kv(a); },
               {"slot_mapping[0] = 84", "the slot of position seq_len - 1 = 19", "block_tables[0][1] * block_size + 3"});
  EXPECT_EQ(kc, written) << "nothing written";
  slots[0] = 5 * 16 + 3;
  lens[1] = 4;  // the new token not counted
  dgtest::expect_error([&] { decodegraph::host::append_kv(a); }, {"slot_mapping[1] = 100", "seq_len - 1 = 3"});
  lens[1] = 5;
  tables[1] = num_blocks;  // the block of position 19
  dgtest::expect_error([&] { decodegraph::host::append_kv(a); }, {"block_tables[0][1] = 8", "0..num_blocks-1 = 0..7"});
  tables[1] = 5;
  lens[1] = stride * 16 + 1;  // no such column
  dgtest::expect_error([&] { decodegraph::host::append_kv(a); }, {"slot_mapping[1]", "no position seq_len - 1 = 64"});
  lens[1] = 5;

  // Without tables: any slot inside the cache is written (vLLM semantics).
  AppendArgs plain = a;
  plain.seq_lens = nullptr;
  plain.block_tables = nullptr;
  slots[0] = 7 * 16;  // not sequence 0's position, but inside the cache
  EXPECT_NO_THROW(decodegraph::host::append_kv(plain));

  AppendArgs half = a;
  half.seq_lens = nullptr;
  dgtest::expect_error([&] { decodegraph::validate_append_args(half); }, {"block_tables", "the slot check needs both"});
  AppendArgs no_stride = a;
  no_stride.block_table_stride = 0;
  dgtest::expect_error([&] { decodegraph::validate_append_args(no_stride); }, {"block_table_stride = 0"});
}

}  // namespace

namespace {

// Groups of tokens_per_seq = n consecutive tokens (a q_len = n step, slot_mapping [num_seqs, n]):
// token j of sequence i goes to position seq_lens[i] - n + j under block-table row i. The slots the
// test computes from that rule (plain loops, test-local layout offsets) are written bit for bit;
// negative slots (rejected drafts, a padded sequence of length 0 with a stale table row) are
// skipped and leave their cache slots as they were; a slot off by one position at a draft token is
// rejected naming the entry, its sequence, its token and its position, with nothing written, and
// the same arguments then append again. Random data, irregular sizes.
struct GroupCase {
  DType dtype;
  KVLayout layout;
  int n;
};

class AppendTokenGroups : public ::testing::TestWithParam<GroupCase> {};

TEST_P(AppendTokenGroups, EachTokenIsCheckedAgainstItsOwnPositionInItsSequence) {
  const GroupCase c = GetParam();
  AttentionSpec s;
  s.dtype = c.dtype;
  s.layout = c.layout;
  s.head_size = 80;
  s.block_size = 16;
  s.num_kv_heads = 3;
  s.num_q_heads = 6;
  const int n = c.n, num_seqs = 5, stride = 13, num_blocks = num_seqs * stride + 3;
  const int tokens = num_seqs * n, H = 3, D = 80, bs = 16;
  const std::size_t cache_elems = static_cast<std::size_t>(num_blocks) * s.block_elems();
  const std::size_t tok_elems = static_cast<std::size_t>(tokens) * H * D;
  std::mt19937_64 rng(1000 + n * 7 + static_cast<int>(c.layout));

  Buffer kc = make_buffer(s.dtype, cache_elems), vc = make_buffer(s.dtype, cache_elems);
  Buffer key = make_buffer(s.dtype, tok_elems), value = make_buffer(s.dtype, tok_elems);
  fill_uniform(s.dtype, kc.data(), cache_elems, rng);
  fill_uniform(s.dtype, vc.data(), cache_elems, rng);
  fill_uniform(s.dtype, key.data(), tok_elems, rng, 2.f, 3.f);  // distinct from the cache's values
  fill_uniform(s.dtype, value.data(), tok_elems, rng, -3.f, -2.f);

  // Distinct random blocks for every table entry; random lengths; sequence 2 padded.
  std::vector<int32_t> pool(num_blocks);
  for (int b = 0; b < num_blocks; ++b) pool[b] = b;
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> tables(pool.begin(), pool.begin() + num_seqs * stride);
  std::vector<int32_t> lens(num_seqs);
  std::uniform_int_distribution<int> len_dist(n, stride * bs - 1);  // room for the one-late slot
  for (int& l : lens) l = len_dist(rng);
  lens[0] = n;  // the shortest sequence: its tokens are positions 0..n-1
  lens[2] = 0;  // padded: its row is stale and never read
  std::vector<int64_t> slots(tokens, -1);
  for (int i = 0; i < num_seqs; ++i)
    for (int j = 0; j < n && lens[i] > 0; ++j) {
      const int p = lens[i] - n + j;
      slots[i * n + j] = static_cast<int64_t>(tables[i * stride + p / bs]) * bs + p % bs;
    }
  if (n > 1) slots[4 * n + n - 1] = -1;  // a rejected draft of sequence 4: skipped

  const ExpectedCaches want = expected_append(s, kc, vc, key, value, slots, tokens, H);

  AppendArgs a;
  a.spec = s;
  a.num_tokens = tokens;
  a.num_blocks = num_blocks;
  a.key = key.data();
  a.value = value.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.slot_mapping = slots.data();
  a.seq_lens = lens.data();
  a.block_tables = tables.data();
  a.block_table_stride = stride;
  a.tokens_per_seq = n;
  const std::vector<unsigned char> k_before(static_cast<unsigned char*>(kc.data()),
                                            static_cast<unsigned char*>(kc.data()) + kc.bytes);

  // A slot one position late at token j of sequence 3 (j = 1 for n > 1: a draft token): rejected,
  // nothing written.
  const int j = n > 1 ? 1 : 0, bad_t = 3 * n + j;
  const int p = lens[3] - n + j;
  std::vector<int64_t> wrong = slots;
  wrong[bad_t] = static_cast<int64_t>(tables[3 * stride + (p + 1) / bs]) * bs + (p + 1) % bs;
  a.slot_mapping = wrong.data();
  const std::string entry = n > 1 ? "slot_mapping[" + std::to_string(bad_t) + "] (sequence 3, token " +
                                        std::to_string(j) + " of tokens_per_seq " + std::to_string(n) + ") = "
                                  : "slot_mapping[3] = ";
  const std::string position = n > 1 ? "seq_len - tokens_per_seq + " + std::to_string(j) : "seq_len - 1";
  dgtest::expect_error([&] { decodegraph::host::append_kv(a); },
                       {entry + std::to_string(wrong[bad_t]), "the slot of position " + position + " = " + std::to_string(p),
                        "block_tables[3][" + std::to_string(p / bs) + "] * block_size + " + std::to_string(p % bs)});
  EXPECT_EQ(std::memcmp(kc.data(), k_before.data(), kc.bytes), 0) << "nothing written";

  // A bad block id at that token's position names the entry of its sequence's row, found at the
  // first of sequence 3's tokens in that block.
  std::vector<int32_t> bad_tables = tables;
  bad_tables[3 * stride + p / bs] = num_blocks + 2;
  int j0 = 0;
  while ((lens[3] - n + j0) / bs != p / bs) ++j0;
  a.slot_mapping = slots.data();
  a.block_tables = bad_tables.data();
  dgtest::expect_error([&] { decodegraph::host::append_kv(a); },
                       {"block_tables[3][" + std::to_string(p / bs) + "] = " + std::to_string(num_blocks + 2),
                        "0..num_blocks-1 = 0.." + std::to_string(num_blocks - 1),
                        "position " + (n > 1 ? "seq_len - tokens_per_seq + " + std::to_string(j0) : position) + " = " +
                            std::to_string(lens[3] - n + j0),
                        "slot_mapping[" + std::to_string(3 * n + j0) + "]"});
  EXPECT_EQ(std::memcmp(kc.data(), k_before.data(), kc.bytes), 0) << "nothing written";

  // The same arguments, right, append after the errors.
  a.block_tables = tables.data();
  ASSERT_NO_THROW(decodegraph::host::append_kv(a));
  EXPECT_EQ(std::memcmp(kc.data(), want.k.data(), kc.bytes), 0) << "K cache";
  EXPECT_EQ(std::memcmp(vc.data(), want.v.data(), vc.bytes), 0) << "V cache";
}

INSTANTIATE_TEST_SUITE_P(Groups, AppendTokenGroups,
                         ::testing::Values(GroupCase{DType::kFloat16, KVLayout::kVLLM, 4},
                                           GroupCase{DType::kBFloat16, KVLayout::kNHD, 4},
                                           GroupCase{DType::kFloat32, KVLayout::kVLLM, 3},
                                           GroupCase{DType::kFloat16, KVLayout::kNHD, 1}),
                         [](const ::testing::TestParamInfo<GroupCase>& info) {
                           return std::string(decodegraph::to_string(info.param.dtype)) + "_" +
                                  (info.param.layout == KVLayout::kNHD ? "NHD" : "VLLM") + "_n" +
                                  std::to_string(info.param.n);
                         });

// tokens_per_seq: 1..kMaxQLen, and with seq_lens a divisor of num_tokens; without them any count.
TEST(AppendTokenGroupsArgs, TokensPerSeqOutsideItsRangeOrNotDividingNumTokensIsRejected) {
  const AttentionSpec s{4, 2, 64, 16, DType::kFloat32, KVLayout::kNHD};
  const int num_blocks = 8, tokens = 6;
  const std::size_t cache = static_cast<std::size_t>(num_blocks) * s.block_elems();
  std::vector<float> kc(cache, 1.f), vc(cache, 2.f), key(tokens * 2 * 64, 3.f), value(tokens * 2 * 64, 4.f);
  std::vector<int32_t> lens = {20, 5}, tables = {3, 5, 6, 0};
  // Sequence 0: positions 17..19 (block 5, offsets 1..3); sequence 1: 2..4 (block 6).
  std::vector<int64_t> slots = {5 * 16 + 1, 5 * 16 + 2, 5 * 16 + 3, 6 * 16 + 2, 6 * 16 + 3, 6 * 16 + 4};
  AppendArgs a;
  a.spec = s;
  a.num_tokens = tokens;
  a.num_blocks = num_blocks;
  a.key = key.data();
  a.value = value.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.slot_mapping = slots.data();
  a.seq_lens = lens.data();
  a.block_tables = tables.data();
  a.block_table_stride = 2;
  a.tokens_per_seq = 3;
  EXPECT_NO_THROW(decodegraph::host::append_kv(a));
  for (int bad : {0, -1, decodegraph::kMaxQLen + 1}) {
    AppendArgs b = a;
    b.tokens_per_seq = bad;
    dgtest::expect_error([&] { decodegraph::validate_append_args(b); },
                         {"tokens_per_seq = " + std::to_string(bad), "1 .. kMaxQLen = 1 .. 16"});
  }
  AppendArgs b = a;
  b.tokens_per_seq = 4;  // 6 tokens are not groups of 4
  dgtest::expect_error([&] { decodegraph::host::append_kv(b); }, {"num_tokens = 6", "a multiple of tokens_per_seq = 4"});
  b.seq_lens = nullptr;  // without the check, any count
  b.block_tables = nullptr;
  EXPECT_NO_THROW(decodegraph::host::append_kv(b));
  // Read as one token per row (tokens_per_seq 1), the same slots fail at token 0.
  AppendArgs one = a;
  one.tokens_per_seq = 1;
  one.num_tokens = 2;
  dgtest::expect_error([&] { decodegraph::host::append_kv(one); }, {"slot_mapping[0] = 81", "seq_len - 1 = 19"});
}

}  // namespace
