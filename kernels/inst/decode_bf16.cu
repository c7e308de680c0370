// Explicit instantiations for __nv_bfloat16 (one dtype per file so the three compile in parallel):
// pass 1 (V1 and V2 kernels) for every supported head size, the merge and the KV append.
#include "kernels/append_kv.cuh"
#include "kernels/merge_partitions.cuh"
#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template void launch_paged_decode<__nv_bfloat16, 64>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, 80>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, 96>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, 112>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, 128>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, 192>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__nv_bfloat16, 256>(DecodeParams, bool, cudaStream_t);
template int paged_decode_blocks_per_sm<__nv_bfloat16, 64>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, 80>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, 96>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, 112>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, 128>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, 192>(int);
template int paged_decode_blocks_per_sm<__nv_bfloat16, 256>(int);
template void launch_merge_partitions<__nv_bfloat16>(const MergeParams&, cudaStream_t);
template void launch_append_kv<__nv_bfloat16>(const AppendParams&, cudaStream_t);

}  // namespace decodegraph::kernels
