// Explicit instantiations for float (one dtype per file so the three compile in parallel):
// pass 1 (V1 and V2 kernels) for every supported head size, the merge and the KV append.
#include "kernels/append_kv.cuh"
#include "kernels/merge_partitions.cuh"
#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template void launch_paged_decode<float, 64>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<float, 80>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<float, 96>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<float, 112>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<float, 128>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<float, 192>(DecodeParams, bool, cudaStream_t);
template void launch_paged_decode<float, 256>(DecodeParams, bool, cudaStream_t);
template int paged_decode_blocks_per_sm<float, 64>(int);
template int paged_decode_blocks_per_sm<float, 80>(int);
template int paged_decode_blocks_per_sm<float, 96>(int);
template int paged_decode_blocks_per_sm<float, 112>(int);
template int paged_decode_blocks_per_sm<float, 128>(int);
template int paged_decode_blocks_per_sm<float, 192>(int);
template int paged_decode_blocks_per_sm<float, 256>(int);
template void launch_merge_partitions<float>(const MergeParams&, cudaStream_t);
template void launch_append_kv<float>(const AppendParams&, cudaStream_t);

}  // namespace decodegraph::kernels
