// Explicit instantiations for __half (one dtype per file so the three compile in parallel):
// pass 1 (V1 and V2 kernels) for every supported head size, the merge and the KV append.
#include "kernels/append_kv.cuh"
#include "kernels/merge_partitions.cuh"
#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template void launch_paged_decode<__half, 64>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__half, 80>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__half, 96>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__half, 112>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__half, 128>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__half, 192>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<__half, 256>(DecodeParams, bool, cudaStream_t);
template int paged_decode_blocks_per_sm<__half, 64>(int);
template int paged_decode_blocks_per_sm<__half, 80>(int);
template int paged_decode_blocks_per_sm<__half, 96>(int);
template int paged_decode_blocks_per_sm<__half, 112>(int);
template int paged_decode_blocks_per_sm<__half, 128>(int);
template int paged_decode_blocks_per_sm<__half, 192>(int);
template int paged_decode_blocks_per_sm<__half, 256>(int);
template void launch_merge_partitions<__half>(const MergeParams&, cudaStream_t);
template void launch_append_kv<__half>(const AppendParams&, cudaStream_t);

}  // namespace decodegraph::kernels
