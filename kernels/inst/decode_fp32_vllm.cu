// Explicit instantiations of the pass-1 kernel for float in the vllm layout, every supported head size.
// One (dtype, layout) per file: the six files compile in parallel.
#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template void launch_paged_decode<float, float, 64, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, float, 80, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, float, 96, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, float, 112, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, float, 128, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, float, 192, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, float, 256, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template int paged_decode_blocks_per_sm<float, float, 64, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, float, 80, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, float, 96, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, float, 112, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, float, 128, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, float, 192, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, float, 256, KVLayout::kVLLM>(int);

}  // namespace decodegraph::kernels
