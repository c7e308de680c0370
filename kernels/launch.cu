// Eager launchers of the public API (attention.hpp): paged_attention_v1, paged_attention_v2,
// append_kv, cuda_device_available. They validate, turn (dtype, kv_dtype, head_size, layout) into
// template values in one switch (dispatch_pass1), and launch the kernels instantiated in inst/*.cu.
//
// Capturable: no allocation, no synchronisation, no host read of device data and no function
// attribute setting (static shared memory stays under 48 KB). Every launch goes through the fault
// seam and is checked with cudaGetLastError (inside the kernels:: launch functions); each entry
// point first clears an error earlier work left pending (DG_CUDA_TAKE_PENDING), so that check
// reports our launches only. Such a leftover is the caller's: the eager API drops it, the CUDA
// backend logs it before calling in.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_math.hpp"
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

// Calls f(std::type_identity<T>{}, std::type_identity<KV>{}): the element types of q / out / math
// and of the cache. fp8 caches compute in fp16 whatever the model dtype (DecodeParams::io_bf16).
template <typename F>
void dispatch_types(const AttentionSpec& spec, F&& f) {
  switch (spec.kv_dtype) {
    case KVCacheDType::kAuto: return dispatch_dtype(spec.dtype, [&](auto t) { f(t, t); });
    case KVCacheDType::kFp8E4M3: return f(std::type_identity<__half>{}, std::type_identity<__nv_fp8_e4m3>{});
    case KVCacheDType::kFp8E5M2: return f(std::type_identity<__half>{}, std::type_identity<__nv_fp8_e5m2>{});
  }
  throw_invalid("kv_dtype", static_cast<int>(spec.kv_dtype), "0 (auto), 1 (fp8_e4m3), 2 (fp8_e5m2)");
}

// Turns (dtype, kv_dtype, head_size, layout) into template values and calls f with the four as
// std::type_identity<T>, std::type_identity<KV>, std::integral_constant<int, D> and
// std::integral_constant<KVLayout, L>.
template <typename F>
void dispatch_pass1(const AttentionSpec& spec, F&& f) {
  dispatch_types(spec, [&](auto t, auto kv) {
    auto with_layout = [&](auto d) {
      switch (spec.layout) {
        case KVLayout::kVLLM: return f(t, kv, d, std::integral_constant<KVLayout, KVLayout::kVLLM>{});
        case KVLayout::kNHD: return f(t, kv, d, std::integral_constant<KVLayout, KVLayout::kNHD>{});
      }
      throw_invalid("layout", static_cast<int>(spec.layout), "0 (vllm), 1 (nhd)");
    };
    switch (spec.head_size) {
      case 64: return with_layout(std::integral_constant<int, 64>{});
      case 80: return with_layout(std::integral_constant<int, 80>{});
      case 96: return with_layout(std::integral_constant<int, 96>{});
      case 112: return with_layout(std::integral_constant<int, 112>{});
      case 128: return with_layout(std::integral_constant<int, 128>{});
      case 192: return with_layout(std::integral_constant<int, 192>{});
      case 256: return with_layout(std::integral_constant<int, 256>{});
    }
    throw_invalid("head_size", spec.head_size, "64, 80, 96, 112, 128, 192, 256");
  });
}

void launch_decode(const DecodeParams& p, const AttentionSpec& spec, cudaStream_t s) {
  dispatch_pass1(spec, [&](auto t, auto kv, auto d, auto layout) {
    kernels::launch_paged_decode<typename decltype(t)::type, typename decltype(kv)::type, decltype(d)::value,
                                 decltype(layout)::value>(p, s);
  });
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
  if (a.spec.fp8_kv()) {
    p.k_scale = a.k_scale;
    p.v_scale = a.v_scale;
    p.scale_per_head = a.spec.kv_scale_per_head;
    p.io_bf16 = a.spec.dtype == DType::kBFloat16;
  }
  p.bad_block = a.bad_block;
  p.num_seqs = a.num_seqs;
  p.num_q_heads = a.spec.num_q_heads;
  p.num_kv_heads = a.spec.num_kv_heads;
  p.block_size = a.spec.block_size;
  p.block_table_stride = a.block_table_stride;
  p.num_blocks = a.num_blocks;
  p.max_seq_len = a.max_seq_len;
  p.q_stride = detail::q_row_stride(a);
  p.out_stride = detail::out_row_stride(a);
  p.scale = a.spec.effective_scale();
  p.scale2 = p.scale * math::kLog2e;
  p.window = a.spec.sliding_window;
  p.q_len = a.q_len;
  p.read_window = math::read_window(a.spec.sliding_window, a.q_len);
  p.window_span = math::window_span(a.spec.sliding_window);
  p.cap2 = a.spec.logit_softcap * math::kLog2e;
  p.cap2_k = math::softcap2_k(p.cap2);
  p.sinks = a.sinks;
  p.layout = a.spec.layout;
  p.programmatic = a.programmatic_launch;
  return p;
}

}  // namespace

// ---------------------------------------------------------------- launchers

void paged_attention_v1(const DecodeArgs& args, Stream stream) {
  validate_decode_args(args);
  (void)DG_CUDA_TAKE_PENDING("paged_attention_v1");
  DecodeParams p = decode_params(args);
  p.partition_size = args.max_seq_len;  // one partition spans every (clamped) length
  p.max_partitions = 1;
  p.write_partials = false;
  launch_decode(p, args.spec, stream);
}

void paged_attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                        std::size_t workspace_bytes, Stream stream) {
  const V2WorkspaceLayout ws = detail::validate_v2_args(args, partition_size, workspace, workspace_bytes);
  (void)DG_CUDA_TAKE_PENDING("paged_attention_v2");  // pass 1's launch check clears for the merge

  char* base = static_cast<char*>(workspace);
  DecodeParams p = decode_params(args);
  p.partition_size = partition_size;
  p.max_partitions = ws.max_partitions;
  p.max_logits = reinterpret_cast<float*>(base + ws.max_logits_offset);
  p.exp_sums = reinterpret_cast<float*>(base + ws.exp_sums_offset);
  p.partial_out = reinterpret_cast<float*>(base + ws.partial_out_offset);
  p.write_partials = true;
  launch_decode(p, args.spec, stream);

  kernels::MergeParams mp;
  mp.max_logits = p.max_logits;
  mp.exp_sums = p.exp_sums;
  mp.partial_out = p.partial_out;
  mp.out = args.out;
  mp.out_stride = p.out_stride;
  mp.seq_lens = args.seq_lens;
  mp.num_seqs = args.num_seqs * args.q_len;  // rows
  mp.q_len = args.q_len;
  mp.num_q_heads = args.spec.num_q_heads;
  mp.head_size = args.spec.head_size;
  mp.max_seq_len = args.max_seq_len;
  mp.partition_size = partition_size;
  mp.max_partitions = ws.max_partitions;
  mp.window = p.read_window;
  mp.block_size = args.spec.block_size;
  mp.sinks = args.sinks;
  mp.programmatic = args.programmatic_launch;  // after pass 1: always a kernel-to-kernel edge
  dispatch_dtype(args.spec.dtype,
                 [&](auto t) { kernels::launch_merge_partitions<typename decltype(t)::type>(mp, stream); });
}

void append_kv(const AppendArgs& args, Stream stream) {
  validate_append_args(args);
  // On the device a wrong slot can only be skipped: without a flag that would go unseen.
  if (args.block_tables != nullptr)
    require(args.bad_slot != nullptr, "bad_slot", "null",
            "a device int with block_tables given (a slot that is not its position's is skipped and reported there)");
  (void)DG_CUDA_TAKE_PENDING("append_kv");
  kernels::AppendParams p;
  p.key = args.key;
  p.value = args.value;
  p.k_cache = args.k_cache;
  p.v_cache = args.v_cache;
  p.slot_mapping = args.slot_mapping;
  p.seq_lens = args.seq_lens;
  p.block_tables = args.block_tables;
  p.block_table_stride = args.block_table_stride;
  p.tokens_per_seq = args.tokens_per_seq;
  p.bad_slot = args.bad_slot;
  p.key_stride = detail::key_row_stride(args);
  p.value_stride = detail::value_row_stride(args);
  p.num_blocks = args.num_blocks;
  p.num_tokens = args.num_tokens;
  p.num_kv_heads = args.spec.num_kv_heads;
  p.head_size = args.spec.head_size;
  p.block_size = args.spec.block_size;
  p.layout = args.spec.layout;
  p.programmatic = args.programmatic_launch;
  if (args.spec.fp8_kv()) {
    p.k_scale = args.k_scale;
    p.v_scale = args.v_scale;
    p.scale_per_head = args.spec.kv_scale_per_head;
  }
  // Key and value are in the model dtype; the cache in the KV type (fp8: quantised).
  dispatch_dtype(args.spec.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    switch (args.spec.kv_dtype) {
      case KVCacheDType::kAuto: return kernels::launch_append_kv<T, T>(p, stream);
      case KVCacheDType::kFp8E4M3:
        if constexpr (sizeof(T) == 2) return kernels::launch_append_kv<T, __nv_fp8_e4m3>(p, stream);
        break;
      case KVCacheDType::kFp8E5M2:
        if constexpr (sizeof(T) == 2) return kernels::launch_append_kv<T, __nv_fp8_e5m2>(p, stream);
        break;
    }
    throw_invalid("kv_dtype", to_string(args.spec.kv_dtype), "auto, or fp8 with dtype fp16 / bf16");
  });
}

namespace kernels {

int pass1_blocks_per_sm_on_device(const AttentionSpec& spec, int q_len) {
  validate_spec(spec);
  int blocks = 0;
  dispatch_pass1(spec, [&](auto t, auto kv, auto d, auto layout) {
    // The rows a KV head serves choose the kernel (launch_paged_decode), not the GQA group alone.
    blocks = paged_decode_blocks_per_sm<typename decltype(t)::type, typename decltype(kv)::type, decltype(d)::value,
                                        decltype(layout)::value>(pass1_rows(spec.group_size(), q_len));
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
