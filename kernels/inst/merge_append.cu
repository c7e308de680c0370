// Explicit instantiations of the V2 merge and the KV append for every dtype.
#include "kernels/append_kv.cuh"
#include "kernels/merge_partitions.cuh"

namespace decodegraph::kernels {

template void launch_merge_partitions<__half>(const MergeParams&, cudaStream_t);
template void launch_merge_partitions<__nv_bfloat16>(const MergeParams&, cudaStream_t);
template void launch_merge_partitions<float>(const MergeParams&, cudaStream_t);
template void launch_append_kv<__half>(const AppendParams&, cudaStream_t);
template void launch_append_kv<__nv_bfloat16>(const AppendParams&, cudaStream_t);
template void launch_append_kv<float>(const AppendParams&, cudaStream_t);

}  // namespace decodegraph::kernels
