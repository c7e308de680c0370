// Naive paged decode attention (V1), the GPU-side reference.
//
// What it computes: out[seq, h] = sum_t softmax(s)_t v_t with s_t = logit(q . k_t), exactly the
// contract of paged_attention_v1, using online softmax with a rescale per token.
// Mapping: grid (num_q_heads, num_seqs); block = head_size threads; thread d walks every token,
// recomputes the full dot product (q cached in shared memory) and accumulates output element d.
// dtype, layout, head size and block size are all runtime values: no templates, no vectors.
// q / out rows honour their strides; block ids are clamped to [0, num_blocks) (and reported through
// bad_block) like the optimised kernels, so a bad id never reads outside the cache.
#include <cuda_runtime.h>

#include <climits>

#include "decodegraph/numeric.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/naive.hpp"
#include "kernels/validate.hpp"

namespace decodegraph::naive {
namespace {

struct NaiveParams {
  DecodeArgs a;
  float scale;
  int64_t q_stride;    // resolved row strides (elements)
  int64_t out_stride;
};

__device__ float load_elem(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
    case DType::kFloat16: return fp16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat32: return static_cast<const float*>(base)[i];
  }
  return 0.0f;
}

__device__ void store_elem(DType dtype, void* base, int64_t i, float v) {
  switch (dtype) {
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = float_to_fp16_bits(v); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v); break;
    case DType::kFloat32: static_cast<float*>(base)[i] = v; break;
  }
}

// ---------------------------------------------------------------- kernel

__global__ void NaivePagedAttentionKernel(const __grid_constant__ NaiveParams np) {
  __shared__ float s_q[256];
  const DecodeArgs& a = np.a;
  const AttentionSpec& s = a.spec;
  const int q_head = blockIdx.x;
  const int seq = blockIdx.y;
  const int d = threadIdx.x;
  const int D = s.head_size;
  const int kv_head = q_head / (s.num_q_heads / s.num_kv_heads);
  const int x = math::vllm_x(s.dtype == DType::kFloat32 ? 4 : 2);

  int len = a.seq_lens[seq];
  if (len > a.max_seq_len) len = a.max_seq_len;
  if (len <= 0) return;  // block-uniform, before the barrier

  s_q[d] = load_elem(s.dtype, a.q, seq * np.q_stride + static_cast<int64_t>(q_head) * D + d);
  __syncthreads();

  const float slope = a.alibi_slopes != nullptr ? a.alibi_slopes[q_head] : 0.0f;
  float m = math::neg_inf(), l = 0.0f, acc = 0.0f;
  // A window's positions only (its blocks only); the soft-cap after scale and bias; the sink joins
  // the denominator like a token whose value is 0.
  for (int pos = math::window_first(len, s.sliding_window); pos < len; ++pos) {
    const int64_t entry = static_cast<int64_t>(seq) * a.block_table_stride + pos / s.block_size;
    int64_t blk = a.block_tables[entry];
    if (blk < 0 || blk >= a.num_blocks) {  // clamp (and report) as the optimised kernels do
      if (a.bad_block != nullptr && d == 0) atomicCAS(a.bad_block, 0, entry + 1 < INT_MAX ? static_cast<int>(entry + 1) : INT_MAX);
      blk = blk < 0 ? 0 : a.num_blocks - 1;
    }
    const int tok = pos % s.block_size;
    float dot = 0.0f;
    for (int e = 0; e < D; ++e)
      dot += s_q[e] * load_elem(s.dtype, a.k_cache,
                                math::k_offset(s.layout, blk, kv_head, tok, e, s.num_kv_heads, D, s.block_size, x));
    float logit = math::logit(dot, np.scale, slope, pos, len);
    if (s.logit_softcap > 0.0f) logit = s.logit_softcap * tanhf(logit / s.logit_softcap);
    const float f = math::online_rescale(m, l, logit);
    const float w = math::exp_shifted(logit, m);
    l += w;
    acc = acc * f +
          w * load_elem(s.dtype, a.v_cache, math::v_offset(s.layout, blk, kv_head, tok, d, s.num_kv_heads, D, s.block_size));
  }
  if (a.sinks != nullptr && a.sinks[q_head] != math::neg_inf()) {
    const float f = math::online_rescale(m, l, a.sinks[q_head]);
    acc *= f;
    l += math::exp_shifted(a.sinks[q_head], m);
  }
  store_elem(s.dtype, a.out, seq * np.out_stride + static_cast<int64_t>(q_head) * D + d, math::normalise(acc, l));
}

}  // namespace

// ---------------------------------------------------------------- launcher

void paged_attention_v1(const DecodeArgs& args, Stream stream) {
  validate_decode_args(args);
  require(args.q_len == 1, "q_len", args.q_len, "1 (the naive kernel takes one query token per sequence)");
  (void)DG_CUDA_TAKE_PENDING("naive::paged_attention_v1");  // so the launch check reports ours only
  NaiveParams np{args, args.spec.effective_scale(), detail::q_row_stride(args), detail::out_row_stride(args)};
  np.a.host_seq_lens = nullptr;  // host pointers mean nothing on the device
  np.a.host_block_tables = nullptr;
  const dim3 grid(static_cast<unsigned>(args.spec.num_q_heads), static_cast<unsigned>(args.num_seqs));
  NaivePagedAttentionKernel<<<grid, args.spec.head_size, 0, stream>>>(np);
  DG_CUDA_CHECK_LAUNCH("NaivePagedAttentionKernel");
}

}  // namespace decodegraph::naive
