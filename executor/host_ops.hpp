// The host backend's kernels (internal): what each of its op nodes does when it runs (eagerly, or
// when a recorded graph replays). Attention and the append run through the host implementation
// (host::) with the CUDA kernels' semantics for staged inputs, so both backends compute the same
// numbers and report bad inputs the same way (host_ops.cpp says how).
#pragma once

#include <cstddef>

#include "decodegraph/attention.hpp"

namespace decodegraph::detail {

/// The kKernelLaunch fault site, checked as a node runs: throws the injected fault, naming `name`'s
/// launch (the twin of a kernel launch that fails).
void check_kernel(const char* name);

/// host::paged_attention_v1 / _v2 on the staged inputs as the kernels see them.
void run_attention_v1(const DecodeArgs& args);
void run_attention_v2(const DecodeArgs& args, int partition_size, void* workspace, std::size_t workspace_bytes);
/// host::append_kv, skipping and reporting the slots the append kernel skips.
void run_append(const AppendArgs& args);

}  // namespace decodegraph::detail
