// Explicit instantiations of the tensor-core pass-1 kernel (kernels/tensor_core_math.cuh) for
// __nv_bfloat16, nhd layout, every supported head size; launch_paged_decode (decode_bf16_nhd.cu) selects it for
// GQA groups of 4 or more. One (dtype, layout) per file: the ten pass-1 files compile in parallel.
#include "kernels/tensor_core_math.cuh"

namespace decodegraph::kernels {

template void enqueue_paged_decode_tc<__nv_bfloat16, __nv_bfloat16, 64, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__nv_bfloat16, __nv_bfloat16, 80, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__nv_bfloat16, __nv_bfloat16, 96, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__nv_bfloat16, __nv_bfloat16, 112, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__nv_bfloat16, __nv_bfloat16, 128, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__nv_bfloat16, __nv_bfloat16, 192, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__nv_bfloat16, __nv_bfloat16, 256, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template int paged_decode_tc_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 64, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 80, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 96, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 112, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 128, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 192, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 256, KVLayout::kNHD>();

}  // namespace decodegraph::kernels
