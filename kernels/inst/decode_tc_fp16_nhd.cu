// Explicit instantiations of the tensor-core pass-1 kernel (kernels/tensor_core_math.cuh) for
// __half, nhd layout, every supported head size; launch_paged_decode (decode_fp16_nhd.cu) selects it for
// GQA groups of 4 or more. One (dtype, layout) per file: the ten pass-1 files compile in parallel.
#include "kernels/tensor_core_math.cuh"

namespace decodegraph::kernels {

template void enqueue_paged_decode_tc<__half, __half, 64, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __half, 80, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __half, 96, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __half, 112, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __half, 128, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __half, 192, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __half, 256, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template int paged_decode_tc_blocks_per_sm<__half, __half, 64, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __half, 80, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __half, 96, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __half, 112, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __half, 128, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __half, 192, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __half, 256, KVLayout::kNHD>();

}  // namespace decodegraph::kernels
