// Explicit instantiations of the pass-1 kernel for __half in the vllm layout, every supported head size.
// One (dtype, layout) per file: the six files compile in parallel.
#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template void launch_paged_decode<__half, __half, 64, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __half, 80, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __half, 96, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __half, 112, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __half, 128, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __half, 192, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __half, 256, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template int paged_decode_blocks_per_sm<__half, __half, 64, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__half, __half, 80, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__half, __half, 96, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__half, __half, 112, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__half, __half, 128, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__half, __half, 192, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<__half, __half, 256, KVLayout::kVLLM>(int);

}  // namespace decodegraph::kernels
