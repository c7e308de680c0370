// Explicit instantiations of the pass-1 kernel for fp8 E4M3 caches in the nhd layout, every
// supported head size: the tensor-core math on fp16 operands at every GQA group, for fp16 and bf16
// models alike (q and out by DecodeParams::io_bf16, outside the main loop), so one (format, layout)
// per file: the four fp8 files compile in parallel with the other pass-1 files.
#include "kernels/tensor_core_math.cuh"

namespace decodegraph::kernels {

template void launch_paged_decode<__half, __nv_fp8_e4m3, 64, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __nv_fp8_e4m3, 80, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __nv_fp8_e4m3, 96, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __nv_fp8_e4m3, 112, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __nv_fp8_e4m3, 128, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __nv_fp8_e4m3, 192, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template void launch_paged_decode<__half, __nv_fp8_e4m3, 256, KVLayout::kNHD>(DecodeParams, cudaStream_t);
template int paged_decode_blocks_per_sm<__half, __nv_fp8_e4m3, 64, KVLayout::kNHD>(int);
template int paged_decode_blocks_per_sm<__half, __nv_fp8_e4m3, 80, KVLayout::kNHD>(int);
template int paged_decode_blocks_per_sm<__half, __nv_fp8_e4m3, 96, KVLayout::kNHD>(int);
template int paged_decode_blocks_per_sm<__half, __nv_fp8_e4m3, 112, KVLayout::kNHD>(int);
template int paged_decode_blocks_per_sm<__half, __nv_fp8_e4m3, 128, KVLayout::kNHD>(int);
template int paged_decode_blocks_per_sm<__half, __nv_fp8_e4m3, 192, KVLayout::kNHD>(int);
template int paged_decode_blocks_per_sm<__half, __nv_fp8_e4m3, 256, KVLayout::kNHD>(int);
template void enqueue_paged_decode_tc<__half, __nv_fp8_e4m3, 64, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __nv_fp8_e4m3, 80, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __nv_fp8_e4m3, 96, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __nv_fp8_e4m3, 112, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __nv_fp8_e4m3, 128, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __nv_fp8_e4m3, 192, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template void enqueue_paged_decode_tc<__half, __nv_fp8_e4m3, 256, KVLayout::kNHD>(const DecodeParams&, cudaStream_t, const char*);
template int paged_decode_tc_blocks_per_sm<__half, __nv_fp8_e4m3, 64, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __nv_fp8_e4m3, 80, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __nv_fp8_e4m3, 96, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __nv_fp8_e4m3, 112, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __nv_fp8_e4m3, 128, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __nv_fp8_e4m3, 192, KVLayout::kNHD>();
template int paged_decode_tc_blocks_per_sm<__half, __nv_fp8_e4m3, 256, KVLayout::kNHD>();

}  // namespace decodegraph::kernels
