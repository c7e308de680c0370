// Internal: argument checks shared by the two V2 entry points (the CUDA launcher and host::).
#pragma once

#include <cstddef>

#include "decodegraph/attention.hpp"

namespace decodegraph::detail {

/// validate_decode_args, validate_partition_size, then the workspace pointer (non-null, 16-byte
/// aligned) and size. Returns the workspace layout the checks computed.
V2WorkspaceLayout validate_v2_args(const DecodeArgs& args, int partition_size, const void* workspace,
                                   std::size_t workspace_bytes);

}  // namespace decodegraph::detail
