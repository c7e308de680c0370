// Eager launchers of the public API (attention.hpp): paged_attention_v1, paged_attention_v2,
// append_kv, cuda_device_available. They validate, turn (dtype, head_size) into template values in
// one switch, and launch the kernels instantiated in inst/*.cu.
//
// Capturable: no allocation, no synchronisation, no host read of device data and no function
// attribute setting (static shared memory stays under 48 KB). Every launch goes through the fault
// seam and is checked with cudaGetLastError (inside the kernels:: launch functions).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/occupancy.hpp"
#include "kernels/validate.hpp"

namespace decodegraph {
namespace {

using kernels::DecodeParams;

// ---------------------------------------------------------------- dispatch (the one switch)

// Calls f(std::type_identity<T>{}) with T the element type of `dtype`.
template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16: return f(std::type_identity<__half>{});
    case DType::kBFloat16: return f(std::type_identity<__nv_bfloat16>{});
    case DType::kFloat32: return f(std::type_identity<float>{});
  }
  throw_invalid("dtype", static_cast<int>(dtype), "fp16, bf16, fp32");
}

template <typename T>
void launch_decode_dtype(const DecodeParams& p, int head_size, bool partials, cudaStream_t s) {
  switch (head_size) {
    case 64: return kernels::launch_paged_decode<T, 64>(p, partials, s);
    case 80: return kernels::launch_paged_decode<T, 80>(p, partials, s);
    case 96: return kernels::launch_paged_decode<T, 96>(p, partials, s);
    case 112: return kernels::launch_paged_decode<T, 112>(p, partials, s);
    case 128: return kernels::launch_paged_decode<T, 128>(p, partials, s);
    case 192: return kernels::launch_paged_decode<T, 192>(p, partials, s);
    case 256: return kernels::launch_paged_decode<T, 256>(p, partials, s);
    default: throw_invalid("head_size", head_size, "64, 80, 96, 112, 128, 192, 256");
  }
}

void launch_decode(const DecodeParams& p, DType dtype, int head_size, bool partials, cudaStream_t s) {
  dispatch_dtype(dtype, [&](auto t) { launch_decode_dtype<typename decltype(t)::type>(p, head_size, partials, s); });
}

DecodeParams decode_params(const DecodeArgs& a) {
  DecodeParams p;
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
  p.max_seq_len = a.max_seq_len;
  p.scale = a.spec.effective_scale();
  p.layout = a.spec.layout;
  return p;
}

}  // namespace

// ---------------------------------------------------------------- launchers

void paged_attention_v1(const DecodeArgs& args, Stream stream) {
  validate_decode_args(args);
  DecodeParams p = decode_params(args);
  p.partition_size = args.max_seq_len;  // one partition spans every (clamped) length
  p.max_partitions = 1;
  launch_decode(p, args.spec.dtype, args.spec.head_size, /*partials=*/false, stream);
}

void paged_attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                        std::size_t workspace_bytes, Stream stream) {
  const V2WorkspaceLayout ws = detail::validate_v2_args(args, partition_size, workspace, workspace_bytes);

  char* base = static_cast<char*>(workspace);
  DecodeParams p = decode_params(args);
  p.partition_size = partition_size;
  p.max_partitions = ws.max_partitions;
  p.max_logits = reinterpret_cast<float*>(base + ws.max_logits_offset);
  p.exp_sums = reinterpret_cast<float*>(base + ws.exp_sums_offset);
  p.partial_out = reinterpret_cast<float*>(base + ws.partial_out_offset);
  launch_decode(p, args.spec.dtype, args.spec.head_size, /*partials=*/true, stream);

  kernels::MergeParams mp;
  mp.max_logits = p.max_logits;
  mp.exp_sums = p.exp_sums;
  mp.partial_out = p.partial_out;
  mp.out = args.out;
  mp.seq_lens = args.seq_lens;
  mp.num_seqs = args.num_seqs;
  mp.num_q_heads = args.spec.num_q_heads;
  mp.head_size = args.spec.head_size;
  mp.max_seq_len = args.max_seq_len;
  mp.partition_size = partition_size;
  mp.max_partitions = ws.max_partitions;
  dispatch_dtype(args.spec.dtype,
                 [&](auto t) { kernels::launch_merge_partitions<typename decltype(t)::type>(mp, stream); });
}

void append_kv(const AppendArgs& args, Stream stream) {
  validate_append_args(args);
  kernels::AppendParams p;
  p.key = args.key;
  p.value = args.value;
  p.k_cache = args.k_cache;
  p.v_cache = args.v_cache;
  p.slot_mapping = args.slot_mapping;
  p.num_tokens = args.num_tokens;
  p.num_kv_heads = args.spec.num_kv_heads;
  p.head_size = args.spec.head_size;
  p.block_size = args.spec.block_size;
  p.layout = args.spec.layout;
  dispatch_dtype(args.spec.dtype, [&](auto t) { kernels::launch_append_kv<typename decltype(t)::type>(p, stream); });
}

namespace kernels {

int pass1_blocks_per_sm_on_device(const AttentionSpec& spec) {
  validate_spec(spec);
  int blocks = 0;
  dispatch_dtype(spec.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    const int g = spec.group_size();
    switch (spec.head_size) {
      case 64: blocks = paged_decode_blocks_per_sm<T, 64>(g); break;
      case 80: blocks = paged_decode_blocks_per_sm<T, 80>(g); break;
      case 96: blocks = paged_decode_blocks_per_sm<T, 96>(g); break;
      case 112: blocks = paged_decode_blocks_per_sm<T, 112>(g); break;
      case 128: blocks = paged_decode_blocks_per_sm<T, 128>(g); break;
      case 192: blocks = paged_decode_blocks_per_sm<T, 192>(g); break;
      case 256: blocks = paged_decode_blocks_per_sm<T, 256>(g); break;
      default: throw_invalid("head_size", spec.head_size, "64, 80, 96, 112, 128, 192, 256");
    }
  });
  return blocks;
}

}  // namespace kernels

bool cuda_device_available() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: "no device" is an answer, not a failure
    return false;
  }
  return n > 0;
}

}  // namespace decodegraph
