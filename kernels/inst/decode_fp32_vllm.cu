// Explicit instantiations of the pass-1 kernel for float in the vllm layout, every supported head size.
// One (dtype, layout) per file: the six files compile in parallel.
#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template void launch_paged_decode<float, 64, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, 80, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, 96, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, 112, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, 128, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, 192, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template void launch_paged_decode<float, 256, KVLayout::kVLLM>(DecodeParams, cudaStream_t);
template int paged_decode_blocks_per_sm<float, 64, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, 80, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, 96, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, 112, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, 128, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, 192, KVLayout::kVLLM>(int);
template int paged_decode_blocks_per_sm<float, 256, KVLayout::kVLLM>(int);

}  // namespace decodegraph::kernels
