// Issue 11, kernel side, on the host implementation and the float64 reference:
//  - strided q / out / new K / new V: a fused QKV buffer [batch, (hq + 2 hk) x d] feeds the append
//    and the attention directly, and the result equals the contiguous path bit for bit;
//  - stride validation names the parameter, the value and what is allowed;
//  - padded rows (length 0) in eager calls: one rule everywhere, including validation with
//    host_seq_lens (the reported case: NHD fp32, 8q/2kv, head 64, seq_lens {0, 40}).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "problem.hpp"

namespace {

using namespace dgtest;
namespace dg = decodegraph;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const dg::Error& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------- fused QKV

/// One decode step's inputs in a fused buffer: row s = [q (hq x d) | k (hk x d) | v (hk x d)].
struct FusedStep {
  Buffer fused;
  int64_t row = 0;  // elements per fused row
  std::vector<int64_t> slots;
};

FusedStep make_fused(const Problem& p, uint64_t seed) {
  const dg::AttentionSpec& s = p.args.spec;
  FusedStep f;
  f.row = static_cast<int64_t>(s.num_q_heads + 2 * s.num_kv_heads) * s.head_size;
  const int n = p.args.num_seqs;
  f.fused = make_buffer(s.dtype, static_cast<std::size_t>(n) * f.row);
  std::mt19937_64 rng(seed);
  fill_uniform(s.dtype, f.fused.data(), static_cast<std::size_t>(n) * f.row, rng);
  // The new token is the last of each sequence: slot of position len - 1 (padded rows: -1).
  for (int i = 0; i < n; ++i) {
    const int len = p.lens[i];
    if (len == 0) {
      f.slots.push_back(-1);
      continue;
    }
    const int32_t blk = p.tables[static_cast<std::size_t>(i) * p.args.block_table_stride + (len - 1) / s.block_size];
    f.slots.push_back(static_cast<int64_t>(blk) * s.block_size + (len - 1) % s.block_size);
  }
  return f;
}

/// Copies `rows` rows of `len` elements, `stride` apart in src, into a packed buffer.
Buffer pack_rows(DType dt, const void* src, int rows, int64_t len, int64_t stride, int64_t offset) {
  const std::size_t es = dg::dtype_size(dt);
  Buffer b = make_buffer(dt, static_cast<std::size_t>(rows) * len);
  for (int r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(b.data()) + r * len * es,
                static_cast<const char*>(src) + (r * stride + offset) * es, len * es);
  return b;
}

TEST(FusedQkv, HostAppendAndAttentionReadTheFusedBufferInPlace) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (KVLayout layout : {KVLayout::kVLLM, KVLayout::kNHD}) {
      ProblemSpec ps;
      ps.spec.dtype = dt;
      ps.spec.layout = layout;
      ps.spec.head_size = 64;
      ps.spec.num_q_heads = 8;
      ps.spec.num_kv_heads = 2;
      ps.spec.block_size = 16;
      ps.lens = {37, 0, 1, 300, 16, 17, 90};  // batch 7, a padded row, block edges
      ps.distinct_blocks = true;              // each new token gets its own slot
      ps.seed = 41 + static_cast<int>(dt) * 2 + static_cast<int>(layout);
      auto p = make_problem(ps);
      SCOPED_TRACE(std::string(dg::to_string(dt)) + " " + dg::to_string(layout));
      const dg::AttentionSpec& s = p->args.spec;
      const int n = p->args.num_seqs, d = s.head_size, hq = s.num_q_heads, hk = s.num_kv_heads;
      FusedStep f = make_fused(*p, 1000 + ps.seed);
      const std::size_t es = dg::dtype_size(dt);

      // Contiguous path: split copies, append, attend.
      Buffer k2 = p->k, v2 = p->v;
      Buffer q_packed = pack_rows(dt, f.fused.data(), n, int64_t{hq} * d, f.row, 0);
      Buffer key_packed = pack_rows(dt, f.fused.data(), n, int64_t{hk} * d, f.row, int64_t{hq} * d);
      Buffer val_packed = pack_rows(dt, f.fused.data(), n, int64_t{hk} * d, f.row, int64_t{hq + hk} * d);
      dg::AppendArgs ap;
      ap.spec = s;
      ap.num_tokens = n;
      ap.num_blocks = p->args.num_blocks;
      ap.key = key_packed.data();
      ap.value = val_packed.data();
      ap.k_cache = k2.data();
      ap.v_cache = v2.data();
      ap.slot_mapping = f.slots.data();
      dg::host::append_kv(ap);
      dg::DecodeArgs packed = p->args;
      packed.k_cache = k2.data();
      packed.v_cache = v2.data();
      packed.q = q_packed.data();
      Buffer out_packed = p->poisoned;
      packed.out = out_packed.data();
      dg::host::paged_attention_v1(packed);

      // Fused path: the same buffers in place, out rows with a gap between them.
      dg::AppendArgs af = ap;
      af.k_cache = p->k.data();
      af.v_cache = p->v.data();
      af.key = static_cast<char*>(f.fused.data()) + int64_t{hq} * d * es;
      af.value = static_cast<char*>(f.fused.data()) + int64_t{hq + hk} * d * es;
      af.key_stride = f.row;
      af.value_stride = f.row;
      dg::host::append_kv(af);
      ASSERT_EQ(std::memcmp(p->k.data(), k2.data(), p->k.bytes), 0) << "strided append differs (K)";
      ASSERT_EQ(std::memcmp(p->v.data(), v2.data(), p->v.bytes), 0) << "strided append differs (V)";

      const int64_t out_stride = int64_t{hq} * d + 24;  // 24 elements of gap: a multiple of 16 bytes for every dtype
      Buffer out_wide = make_buffer(dt, static_cast<std::size_t>(n) * out_stride);
      poison(dt, out_wide.data(), static_cast<std::size_t>(n) * out_stride);
      const Buffer wide_poison = out_wide;
      dg::DecodeArgs fa = p->args;
      fa.q = f.fused.data();
      fa.q_stride = f.row;
      fa.out = out_wide.data();
      fa.out_stride = out_stride;
      for (int version = 1; version <= 2; ++version) {
        std::memcpy(out_wide.data(), wide_poison.data(), out_wide.bytes);
        if (version == 1)
          dg::host::paged_attention_v1(fa);
        else
          run_host_v2(fa, 64);
        // Gaps and padded rows untouched; live rows equal the contiguous result bit for bit (V1),
        // or the reference within tolerance (V2: another partitioning).
        for (int r = 0; r < n; ++r) {
          const char* row = static_cast<const char*>(out_wide.data()) + r * out_stride * es;
          const char* poison_row = static_cast<const char*>(wide_poison.data()) + r * out_stride * es;
          EXPECT_EQ(std::memcmp(row + int64_t{hq} * d * es, poison_row + int64_t{hq} * d * es, 24 * es), 0)
              << "V" << version << " wrote into the gap after row " << r;
          if (p->lens[r] == 0)
            EXPECT_EQ(std::memcmp(row, poison_row, int64_t{hq} * d * es), 0) << "V" << version << " padded row " << r;
          else if (version == 1)
            EXPECT_EQ(std::memcmp(row, static_cast<const char*>(out_packed.data()) + r * int64_t{hq} * d * es,
                                  int64_t{hq} * d * es),
                      0)
                << "V1 row " << r << " differs from the contiguous run";
        }
        Buffer got = pack_rows(dt, out_wide.data(), n, int64_t{hq} * d, out_stride, 0);
        p->ref.assign(p->out_elems, std::nan(""));
        dg::reference::paged_attention(fa, p->ref.data());  // reads q through q_stride itself
        EXPECT_TRUE(check_close(dt, got.data(), p->ref.data(), n, hq, d, tolerance(dt).atol, tolerance(dt).rtol,
                                p->mask))
            << "V" << version;
      }
    }
  }
}

TEST(FusedQkv, ReferenceReadsQThroughItsStride) {
  // The reference with a strided q equals the reference on the packed copy: it is the yardstick
  // for the strided kernels, so it must not ignore the stride.
  ProblemSpec ps;
  ps.spec.num_q_heads = 4;
  ps.spec.num_kv_heads = 2;
  ps.spec.head_size = 64;
  ps.lens = {20, 33};
  auto p = make_problem(ps);
  p->run_reference();
  const std::vector<double> packed_ref = p->ref;
  const int64_t row = 4 * 64, stride = row + 64;
  const std::size_t es = dg::dtype_size(ps.spec.dtype);
  Buffer wide = make_buffer(ps.spec.dtype, 2 * stride);
  std::mt19937_64 rng(3);
  fill_uniform(ps.spec.dtype, wide.data(), 2 * stride, rng);  // the gaps hold other values
  for (int r = 0; r < 2; ++r)
    std::memcpy(static_cast<char*>(wide.data()) + r * stride * es, static_cast<const char*>(p->q.data()) + r * row * es,
                row * es);
  dg::DecodeArgs a = p->args;
  a.q = wide.data();
  a.q_stride = stride;
  std::vector<double> ref(p->out_elems, 0.0);
  dg::reference::paged_attention(a, ref.data());
  EXPECT_EQ(ref, packed_ref);
}

// ---------------------------------------------------------------- stride validation

TEST(StrideValidation, RowStridesNameParameterValueAndAllowed) {
  ProblemSpec ps;
  ps.spec.dtype = DType::kBFloat16;
  ps.spec.num_q_heads = 8;
  ps.spec.num_kv_heads = 2;
  ps.spec.head_size = 64;
  ps.lens = {10};
  auto p = make_problem(ps);
  dg::DecodeArgs a = p->args;
  a.q_stride = 8 * 64 - 8;  // shorter than a row
  std::string m = error_of([&] { dg::validate_decode_args(a); });
  EXPECT_NE(m.find("q_stride = 504"), std::string::npos) << m;
  EXPECT_NE(m.find(">= 512 (one row)"), std::string::npos) << m;
  a.q_stride = 8 * 64 + 4;  // 8 bytes: not a whole 16-byte chunk
  m = error_of([&] { dg::validate_decode_args(a); });
  EXPECT_NE(m.find("q_stride = 516"), std::string::npos) << m;
  EXPECT_NE(m.find("a multiple of 8 elements (16 bytes)"), std::string::npos) << m;
  a.q_stride = 8 * 64 + 8;
  EXPECT_NO_THROW(dg::validate_decode_args(a));
  a.out_stride = -16;
  m = error_of([&] { dg::validate_decode_args(a); });
  EXPECT_NE(m.find("out_stride = -16"), std::string::npos) << m;
  a.out_stride = 0;
  EXPECT_NO_THROW(dg::host::paged_attention_v1(a));

  dg::AppendArgs ap;
  ap.spec = ps.spec;
  ap.num_tokens = 1;
  ap.num_blocks = a.num_blocks;
  ap.key = p->q.data();
  ap.value = p->q.data();
  ap.k_cache = p->k.data();
  ap.v_cache = p->v.data();
  const int64_t slot = 0;
  ap.slot_mapping = &slot;
  ap.key_stride = 2 * 64 - 8;
  m = error_of([&] { dg::validate_append_args(ap); });
  EXPECT_NE(m.find("key_stride = 120"), std::string::npos) << m;
  EXPECT_NE(m.find(">= 128 (one row)"), std::string::npos) << m;
  ap.key_stride = 0;
  ap.value_stride = 2 * 64 + 1;
  m = error_of([&] { dg::validate_append_args(ap); });
  EXPECT_NE(m.find("value_stride = 129"), std::string::npos) << m;
}

// ---------------------------------------------------------------- padded rows in eager calls

// The case reported in issue 11: validation with host_seq_lens rejected the padded row that the
// header documents and the host path accepts.
TEST(PaddedRows, ReportedCaseAcceptedWithHostLengths) {
  ProblemSpec ps;
  ps.spec.layout = KVLayout::kNHD;
  ps.spec.dtype = DType::kFloat32;
  ps.spec.num_q_heads = 8;
  ps.spec.num_kv_heads = 2;
  ps.spec.head_size = 64;
  ps.lens = {0, 40};
  auto p = make_problem(ps);
  p->args.host_seq_lens = p->lens.data();
  p->args.host_block_tables = p->tables.data();
  EXPECT_NO_THROW(dg::validate_decode_args(p->args));
  p->run_reference();
  dg::host::paged_attention_v1(p->args);
  EXPECT_TRUE(p->padded_rows_untouched());
  EXPECT_TRUE(p->check(tolerance(DType::kFloat32)));
  p->poison_out();
  run_host_v2(p->args, 16);
  EXPECT_TRUE(p->padded_rows_untouched());
  EXPECT_TRUE(p->check(tolerance(DType::kFloat32)));
  // Negative lengths are still rejected, naming the entry.
  p->lens[0] = -1;
  const std::string m = error_of([&] { dg::validate_decode_args(p->args); });
  EXPECT_NE(m.find("seq_lens[0] = -1"), std::string::npos) << m;
}

}  // namespace
