// Explicit instantiations of the pass-1 kernel for __nv_bfloat16 in the vllm layout, every supported head size.
// One (dtype, layout) per file: the six files compile in parallel.
#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 64, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 80, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 96, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 112, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 128, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 192, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, __nv_bfloat16, 256, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template int paged_decode_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 64, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 80, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 96, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 112, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 128, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 192, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, __nv_bfloat16, 256, KVLayout::kVLLM>(int);

}  // namespace decodegraph::kernels
