// Explicit instantiations of the V2 merge and the KV append for every dtype and cache type.
#include "kernels/append_kv.cuh"
#include "kernels/merge_partitions.cuh"

namespace decodegraph::kernels {

template void launch_merge_partitions<__half>(const MergeParams&, cudaStream_t);
template void launch_merge_partitions<__nv_bfloat16>(const MergeParams&, cudaStream_t);
template void launch_merge_partitions<float>(const MergeParams&, cudaStream_t);
template void launch_append_kv<__half, __half>(const AppendParams&, cudaStream_t);
template void launch_append_kv<__nv_bfloat16, __nv_bfloat16>(const AppendParams&, cudaStream_t);
template void launch_append_kv<float, float>(const AppendParams&, cudaStream_t);
// Quantising appends into fp8 caches (key / value fp16 or bf16).
template void launch_append_kv<__half, __nv_fp8_e4m3>(const AppendParams&, cudaStream_t);
template void launch_append_kv<__nv_bfloat16, __nv_fp8_e4m3>(const AppendParams&, cudaStream_t);
template void launch_append_kv<__half, __nv_fp8_e5m2>(const AppendParams&, cudaStream_t);
template void launch_append_kv<__nv_bfloat16, __nv_fp8_e5m2>(const AppendParams&, cudaStream_t);

}  // namespace decodegraph::kernels
