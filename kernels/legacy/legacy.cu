// Launchers of the legacy pass-1 kernel (legacy.hpp): the library's validation, then the kernel of
// paged_decode_legacy.cuh for bf16 / fp16 at head size 128, and for V2 the library's merge.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "decodegraph/error.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/legacy/legacy.hpp"
#include "kernels/legacy/paged_decode_legacy.cuh"
#include "kernels/validate.hpp"

namespace decodegraph::legacy {
namespace {

void check_legacy_args(const DecodeArgs& a) {
  require(supports(a.spec), "spec", std::string(to_string(a.spec.dtype)) + " head_size " + std::to_string(a.spec.head_size),
          "bf16 or fp16 at head_size 128 (the legacy kernel is compiled for those only)");
  require(a.q_stride == 0, "q_stride", a.q_stride, "0 (the legacy kernel reads contiguous q only)");
  require(a.out_stride == 0, "out_stride", a.out_stride, "0 (the legacy kernel writes contiguous out only)");
  require(a.bad_block == nullptr, "bad_block", "non-null", "null (the legacy kernel does not clamp block ids)");
  require(a.spec.sliding_window == 0, "spec.sliding_window", a.spec.sliding_window, "0 (the legacy kernel has no window)");
  require(a.spec.logit_softcap == 0.0f, "spec.logit_softcap", a.spec.logit_softcap, "0 (the legacy kernel has no soft-cap)");
  require(a.sinks == nullptr, "sinks", "non-null", "null (the legacy kernel has no sinks)");
  require(a.q_len == 1, "q_len", a.q_len, "1 (the legacy kernel takes one query token per sequence)");
}

kernels::DecodeParams params(const DecodeArgs& a) {
  kernels::DecodeParams p;
  p.q = a.q;
  p.out = a.out;
  p.k_cache = a.k_cache;
  p.v_cache = a.v_cache;
  p.block_tables = a.block_tables;
  p.seq_lens = a.seq_lens;
  p.alibi_slopes = a.alibi_slopes;
  p.num_seqs = a.num_seqs;
  p.num_q_heads = a.spec.num_q_heads;
  p.num_kv_heads = a.spec.num_kv_heads;
  p.block_size = a.spec.block_size;
  p.block_table_stride = a.block_table_stride;
  p.num_blocks = a.num_blocks;
  p.max_seq_len = a.max_seq_len;
  p.scale = a.spec.effective_scale();
  p.layout = a.spec.layout;
  return p;
}

template <typename F>
void dispatch(DType dtype, F&& f) {
  if (dtype == DType::kBFloat16) return f(std::type_identity<__nv_bfloat16>{});
  return f(std::type_identity<__half>{});
}

}  // namespace

bool supports(const AttentionSpec& spec) {
  return (spec.dtype == DType::kBFloat16 || spec.dtype == DType::kFloat16) && spec.head_size == 128 && !spec.fp8_kv();
}

void paged_attention_v1(const DecodeArgs& args, Stream stream) {
  validate_decode_args(args);
  check_legacy_args(args);
  (void)DG_CUDA_TAKE_PENDING("legacy::paged_attention_v1");  // so the launch checks report ours only
  kernels::DecodeParams p = params(args);
  p.partition_size = args.max_seq_len;
  p.max_partitions = 1;
  p.write_partials = false;
  dispatch(args.spec.dtype,
           [&](auto t) { kernels::legacy::launch_paged_decode<typename decltype(t)::type, 128>(p, stream); });
}

void paged_attention_v2(const DecodeArgs& args, int partition_size, void* workspace, std::size_t workspace_bytes,
                        Stream stream) {
  const V2WorkspaceLayout ws = detail::validate_v2_args(args, partition_size, workspace, workspace_bytes);
  check_legacy_args(args);
  (void)DG_CUDA_TAKE_PENDING("legacy::paged_attention_v2");
  char* base = static_cast<char*>(workspace);
  kernels::DecodeParams p = params(args);
  p.partition_size = partition_size;
  p.max_partitions = ws.max_partitions;
  p.max_logits = reinterpret_cast<float*>(base + ws.max_logits_offset);
  p.exp_sums = reinterpret_cast<float*>(base + ws.exp_sums_offset);
  p.partial_out = reinterpret_cast<float*>(base + ws.partial_out_offset);
  p.write_partials = true;
  kernels::MergeParams mp;
  mp.max_logits = p.max_logits;
  mp.exp_sums = p.exp_sums;
  mp.partial_out = p.partial_out;
  mp.out = args.out;
  mp.out_stride = static_cast<int64_t>(args.spec.num_q_heads) * args.spec.head_size;
  mp.seq_lens = args.seq_lens;
  mp.num_seqs = args.num_seqs;
  mp.num_q_heads = args.spec.num_q_heads;
  mp.head_size = args.spec.head_size;
  mp.max_seq_len = args.max_seq_len;
  mp.partition_size = partition_size;
  mp.max_partitions = ws.max_partitions;
  dispatch(args.spec.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    kernels::legacy::launch_paged_decode<T, 128>(p, stream);
    kernels::launch_merge_partitions<T>(mp, stream);
  });
}

}  // namespace decodegraph::legacy
