// The pass-1 kernel as it was before the cp.async rewrite (issue 9), kept so that a benchmark can
// run it beside the current kernel in one process (bench_attention's `kernel:legacy` axis). Not
// part of the library or its install: the dg_legacy_kernels target (kernels/legacy/CMakeLists.txt),
// built only where a benchmark links it, for bf16 and fp16 at head size 128.
#pragma once

#include <cstddef>

#include "decodegraph/attention.hpp"
#include "decodegraph/types.hpp"

namespace decodegraph::legacy {

/// True when the legacy kernel is compiled for the spec (bf16 or fp16, head size 128).
bool supports(const AttentionSpec& spec);

/// paged_attention_v1 / v2 (attention.hpp) with the legacy pass 1; V2 merges with the library's
/// merge kernel. Same contract and validation, except that it takes contiguous q / out only
/// (q_stride = out_stride = 0) and no bad_block (the legacy kernel does not clamp block ids).
/// Throws Error for anything else, including a spec supports() rejects.
void paged_attention_v1(const DecodeArgs& args, Stream stream);
void paged_attention_v2(const DecodeArgs& args, int partition_size, void* workspace, std::size_t workspace_bytes,
                        Stream stream);

}  // namespace decodegraph::legacy
