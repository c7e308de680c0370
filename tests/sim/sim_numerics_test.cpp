// The numerical contract of the pass-1 kernels under the CPU simulator (docs/design.md,
// "Numerical contract"; the bound and its constants: tests/kernels/numerics.hpp). Each case runs V1
// and V2 pass 1 + merge against a float64 reference of every partition, and prints what it
// measured: the error of the dtype outputs (V1, V2), the share of them equal to the correctly
// rounded value, and the error of the fp32 V2 partials, where no output rounding hides the math.
//
// The error table (issue 23's cases and the contract's edge cases; about 3 s, all in CI):
//   build/tests/sim/dg_sim_numerics_tests
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../kernels/numerics.hpp"
#include "../kernels/problem.hpp"
#include "sim_problem.hpp"
#include "cuda_runtime.h"
#include "decodegraph/attention.hpp"
#include "test_util.hpp"

#ifndef DECODEGRAPH_SIM
#error "tests/sim must compile against tests/sim/shim, not the CUDA toolkit headers"
#endif

namespace {

using namespace decodegraph;
namespace nm = dgtest::numerics;

using dgsim::Dev;
using dgsim::sim_ok;

/// How a case shapes its logits.
enum class Logits {
  kRandom,    // q, k uniform in [-1, 1]
  kSpan90,    // q uniform in [-40, 40]: logits spanning ~90 (natural units) at head 128
  kDominant,  // per KV head, one token whose key is 4 x the group's first query: ~15 above the rest
  kEqual,     // every token of a KV head has the same key: equal logits (plus ALiBi)
  kBelowCap,  // GQA 1: keys -g q + noise, logits ~ -3 cap: the soft-cap's worst region (its r -> 1)
};

struct Case {
  const char* name;
  DType dtype;
  int head_size, block_size;
  KVLayout layout;
  int q_heads, kv_heads;
  std::vector<int> lens;
  bool alibi;
  Logits logits;
  KVCacheDType kv = KVCacheDType::kAuto;  // fp8: codes at k 1/128 (|K| < 1), v 1/256, per KV head
  float cap = 0.0f;  // logit soft-cap (the approximate exp2 and reciprocal: the contract's C term)
};

std::unique_ptr<dgtest::Problem> build(const Case& c, uint64_t seed) {
  dgtest::ProblemSpec ps;
  ps.spec.dtype = c.dtype;
  ps.spec.head_size = c.head_size;
  ps.spec.block_size = c.block_size;
  ps.spec.layout = c.layout;
  ps.spec.num_q_heads = c.q_heads;
  ps.spec.num_kv_heads = c.kv_heads;
  ps.spec.kv_dtype = c.kv;
  ps.spec.kv_scale_per_head = c.kv != KVCacheDType::kAuto;
  ps.spec.logit_softcap = c.cap;
  ps.k_scale = 1.0f / 128;
  ps.v_scale = 1.0f / 256;
  ps.lens = c.lens;
  ps.alibi = c.alibi;
  ps.distinct_blocks = true;  // the crafted keys below belong to one token each
  ps.seed = seed;
  auto p = dgtest::make_problem(ps);
  const AttentionSpec& s = ps.spec;
  const int D = s.head_size, group = s.num_q_heads / s.num_kv_heads;
  const nm::Strides st{s.layout, s.num_kv_heads, D, s.block_size, static_cast<int64_t>(16 / s.kv_elem_size())};
  // K element values (fp8: through its code and the KV head's scale).
  auto store_k = [&](int64_t i, int kvh, float v) {
    if (s.fp8_kv())
      static_cast<uint8_t*>(p->k.data())[i] = float_to_fp8_bits(s.kv_dtype, v / p->k_scales[kvh]);
    else
      store_from_float(s.dtype, p->k.data(), i, v);
  };
  auto load_k = [&](int64_t i, int kvh) {
    return s.fp8_kv() ? load_kv_as_float(s, p->k.data(), i) * p->k_scales[kvh] : load_as_float(s.dtype, p->k.data(), i);
  };
  std::mt19937_64 rng(seed + 1);
  if (c.logits == Logits::kSpan90) {
    dgtest::fill_uniform(s.dtype, p->q.data(), p->out_elems, rng, -40.f, 40.f);
  }
  for (int seq = 0; seq < static_cast<int>(c.lens.size()); ++seq) {
    const int len = c.lens[seq];
    const int32_t* table = p->tables.data() + static_cast<std::size_t>(seq) * p->args.block_table_stride;
    for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
      if (c.logits == Logits::kDominant && len > 0) {
        const int t = std::uniform_int_distribution<int>(0, len - 1)(rng);
        const int64_t q0 = (static_cast<int64_t>(seq) * s.num_q_heads + kvh * group) * D;
        for (int d = 0; d < D; ++d)
          store_k(st.k(table[t / s.block_size], kvh, t % s.block_size, d), kvh,
                  (s.fp8_kv() ? 3.f : 4.f) * load_as_float(s.dtype, p->q.data(), q0 + d));
      }
      if (c.logits == Logits::kBelowCap) {
        // k_t = -g q + u(-0.05, 0.05) per element, g such that scale q . (g q) = 3 cap.
        const int64_t q0 = (static_cast<int64_t>(seq) * s.num_q_heads + kvh * group) * D;
        double qq = 0;
        for (int d = 0; d < D; ++d) qq += std::pow(load_as_float(s.dtype, p->q.data(), q0 + d), 2);
        const double g = 3.0 * c.cap / (s.effective_scale() * qq);
        std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
        for (int t = 0; t < len; ++t)
          for (int d = 0; d < D; ++d)
            store_k(st.k(table[t / s.block_size], kvh, t % s.block_size, d), kvh,
                    static_cast<float>(-g * load_as_float(s.dtype, p->q.data(), q0 + d)) + noise(rng));
      }
      if (c.logits == Logits::kEqual)
        for (int t = 1; t < len; ++t)
          for (int d = 0; d < D; ++d) {
            const float k0 = load_k(st.k(table[0], kvh, 0, d), kvh);
            store_k(st.k(table[t / s.block_size], kvh, t % s.block_size, d), kvh, k0);
          }
    }
  }
  return p;
}

struct Result {
  nm::Measure v1, v2;
  nm::PartialMeasure partials;
  double span = 0;
};

/// V1 and V2 (pass 1 + merge, partition_size P) on the simulator, against the float64 reference.
Result run(dgtest::Problem& p, int P) {
  dgsim::DeviceProblem dp(p);
  const DecodeArgs& a = dp.args;
  Dev& out = dp.out;
  const nm::Reference whole = nm::reference_partitions(p.args, p.args.max_seq_len);
  const nm::Reference parts = nm::reference_partitions(p.args, P);
  Result r;
  for (const nm::Part& x : whole.parts) r.span = std::max(r.span, x.n ? x.span : 0.0);

  paged_attention_v1(a, nullptr);
  out.fetch(p.out.data());
  r.v1 = nm::measure_output(p.args, whole, p.out.data());

  const std::size_t wb = v2_workspace_size(a.spec, a.num_seqs, a.max_seq_len, P);
  Dev ws(wb);
  sim_ok(cudaMemset(ws.p, 0xff, wb), "cudaMemset");
  paged_attention_v2(a, P, ws.p, wb, nullptr);
  out.fetch(p.out.data());
  r.v2 = nm::measure_output(p.args, whole, p.out.data());
  std::vector<unsigned char> host_ws(wb);
  ws.fetch(host_ws.data());
  r.partials = nm::measure_partials(p.args, parts, P, host_ws.data());
  return r;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"bf16, GQA 4, 1300 tokens", DType::kBFloat16, 128, 16, KVLayout::kVLLM, 8, 2, {1300}, false, Logits::kRandom},
      {"bf16, logits spanning ~90", DType::kBFloat16, 128, 16, KVLayout::kVLLM, 8, 2, {1300}, false, Logits::kSpan90},
      {"bf16, GQA 20 (two head chunks), 4200 tokens", DType::kBFloat16, 128, 16, KVLayout::kNHD, 20, 1, {4200}, false, Logits::kRandom},
      {"fp16, GQA 7, 3001 tokens", DType::kFloat16, 128, 16, KVLayout::kVLLM, 14, 2, {3001}, false, Logits::kRandom},
      {"fp16, GQA 7, 3001 tokens, ALiBi", DType::kFloat16, 128, 16, KVLayout::kVLLM, 14, 2, {3001}, true, Logits::kRandom},
      {"bf16, GQA 8, one dominant token", DType::kBFloat16, 128, 16, KVLayout::kNHD, 16, 2, {700, 37}, false, Logits::kDominant},
      {"fp16, GQA 16, all-equal logits", DType::kFloat16, 64, 32, KVLayout::kVLLM, 16, 1, {500, 3}, false, Logits::kEqual},
      {"bf16, GQA 5, D 80, ALiBi", DType::kBFloat16, 80, 8, KVLayout::kNHD, 10, 2, {900, 17}, true, Logits::kRandom},
      {"fp16, GQA 4, D 256, logits spanning ~90", DType::kFloat16, 256, 16, KVLayout::kNHD, 4, 1, {600}, false, Logits::kSpan90},
      {"bf16, GQA 2 (CUDA cores)", DType::kBFloat16, 128, 16, KVLayout::kVLLM, 4, 2, {1300}, false, Logits::kRandom},
      {"fp32, GQA 4 (CUDA cores)", DType::kFloat32, 128, 16, KVLayout::kVLLM, 8, 2, {1300}, false, Logits::kRandom},
      // fp8 caches: the fp16 tensor-core path at every group (bf16 q converted to fp16 per row),
      // per-KV-head scales folded into the logit scale and the epilogue.
      {"fp8 E4M3, bf16 q, GQA 4, 1300 tokens", DType::kBFloat16, 128, 16, KVLayout::kVLLM, 8, 2, {1300}, false,
       Logits::kRandom, KVCacheDType::kFp8E4M3},
      {"fp8 E5M2, fp16 q, GQA 1, 3001 tokens, ALiBi", DType::kFloat16, 128, 16, KVLayout::kNHD, 2, 2, {3001}, true,
       Logits::kRandom, KVCacheDType::kFp8E5M2},
      {"fp8 E4M3, bf16 q, logits spanning ~90", DType::kBFloat16, 128, 8, KVLayout::kVLLM, 8, 2, {1300}, false,
       Logits::kSpan90, KVCacheDType::kFp8E4M3},
      {"fp8 E4M3, fp16 q, GQA 8, one dominant token", DType::kFloat16, 64, 16, KVLayout::kNHD, 16, 2, {700, 37},
       false, Logits::kDominant, KVCacheDType::kFp8E4M3},
      {"fp8 E5M2, bf16 q, GQA 16, all-equal logits", DType::kBFloat16, 256, 32, KVLayout::kVLLM, 16, 1, {500, 3},
       false, Logits::kEqual, KVCacheDType::kFp8E5M2},
      // Logit soft-caps (issue 39): logits spanning ~90 through caps of 30 and 50 (Gemma 2, Grok),
      // which bend them where the cap's approximate exp2 and reciprocal err most; both maths.
      {"fp32, GQA 1 (CUDA cores), soft-cap 50, logits spanning ~90", DType::kFloat32, 128, 16, KVLayout::kNHD, 2, 2,
       {1300}, false, Logits::kSpan90, KVCacheDType::kAuto, 50.0f},
      {"bf16, GQA 2 (CUDA cores), soft-cap 30, ALiBi", DType::kBFloat16, 128, 16, KVLayout::kVLLM, 4, 2, {1300}, true,
       Logits::kSpan90, KVCacheDType::kAuto, 30.0f},
      {"fp16, GQA 4, soft-cap 50, logits spanning ~90", DType::kFloat16, 128, 16, KVLayout::kVLLM, 8, 2, {1300}, false,
       Logits::kSpan90, KVCacheDType::kAuto, 50.0f},
      {"fp8 E4M3, bf16 q, GQA 4, soft-cap 50, logits spanning ~90", DType::kBFloat16, 128, 16, KVLayout::kNHD, 8, 2,
       {1300}, false, Logits::kSpan90, KVCacheDType::kFp8E4M3, 50.0f},
      // Every logit near -3 caps: where the cap's reciprocal errs most, relative to the weights.
      {"fp32, GQA 1 (CUDA cores), soft-cap 30, logits near -90", DType::kFloat32, 128, 16, KVLayout::kVLLM, 2, 2,
       {1300}, false, Logits::kBelowCap, KVCacheDType::kAuto, 30.0f},
      {"bf16, GQA 1 (CUDA cores), soft-cap 50, logits near -150", DType::kBFloat16, 64, 16, KVLayout::kNHD, 1, 1,
       {2000}, false, Logits::kBelowCap, KVCacheDType::kAuto, 50.0f},
  };
  return c;
}

// The contract (numerics.hpp) on every case: the fp32 V2 partials, where nothing hides the math
// (every element within 6 deviations, the rms of the normalised error at most 1: a kernel with
// twice the error fails, see tests/sim/README.md), the max logits and exp sums, and the V1 and
// V2 outputs (within 6 deviations beyond their own rounding, and for fp16 / bf16 at least 95 %
// correctly rounded). Prints the error table.
TEST(Numerics, ContractHoldsOnEveryCase) {
  std::printf("| case | path | logit span | V1: max abs err | V1: max err / R | V1: correctly rounded | V2 partials: max err / R "
              "| V2 partials: max z | V2 partials: rms z | V2: correctly rounded |\n|---|---|---|---|---|---|---|---|---|---|\n");
  int i = 0;
  for (const Case& c : cases()) {
    ++i;
    auto p = build(c, 2300 + static_cast<uint64_t>(i));
    const Result r = run(*p, 512);
    std::printf("| %s | %s | %.1f | %.3g | %.3g | %.1f %% | %.3g | %.3g | %.3g | %.1f %% |\n", c.name,
                nm::to_string(nm::path_of(p->args.spec)), r.span, r.v1.max_abs, r.v1.max_over_R, 100 * r.v1.share(),
                r.partials.o.max_over_R, r.partials.o.max_z, r.partials.o.rms_z(), 100 * r.v2.share());
    if (std::getenv("NUMERICS_DEBUG"))
      std::printf("   partials m %.3g l %.3g | V1 max z %.3g rms z %.3g | V2 max z %.3g rms z %.3g\n"
                  "   worst partial: %s\n   worst V1: %s\n",
                  r.partials.max_m_err, r.partials.max_l_rel, r.v1.max_z, r.v1.rms_z(), r.v2.max_z, r.v2.rms_z(),
                  r.partials.o.worst.c_str(), r.v1.worst.c_str());
    std::fflush(stdout);
    const DType dt = p->args.spec.dtype;
    EXPECT_TRUE(r.partials.o.holds(DType::kFloat32, false)) << c.name << ": V2 partial_out";
    EXPECT_TRUE(r.partials.holds()) << c.name << ": V2 max logits / exp sums";
    EXPECT_TRUE(r.v1.holds(dt, true)) << c.name << ": V1";
    EXPECT_TRUE(r.v2.holds(dt, true)) << c.name << ": V2";
  }
}

}  // namespace
