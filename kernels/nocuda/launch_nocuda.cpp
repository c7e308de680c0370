// Builds without CUDA: the eager launchers exist (so every caller links) and say why they cannot
// run; cuda_device_available() is false, which makes GPU tests skip and the executor pick the host
// backend.
#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "kernels/occupancy.hpp"

namespace decodegraph {

void paged_attention_v1(const DecodeArgs&, Stream) {
  throw Error("paged_attention_v1: decodegraph was built without CUDA; use host::paged_attention_v1");
}

void paged_attention_v2(const DecodeArgs&, int, void*, std::size_t, Stream) {
  throw Error("paged_attention_v2: decodegraph was built without CUDA; use host::paged_attention_v2");
}

void append_kv(const AppendArgs&, Stream) {
  throw Error("append_kv: decodegraph was built without CUDA; use host::append_kv");
}

bool cuda_device_available() { return false; }

namespace kernels {
int pass1_blocks_per_sm_on_device(const AttentionSpec&, int) {
  throw Error("pass1_blocks_per_sm_on_device: decodegraph was built without CUDA; use pass1_resources");
}
}  // namespace kernels

}  // namespace decodegraph
