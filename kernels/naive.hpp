// The simple version (kept on purpose): a naive V1 kernel in plain loops, fp32, one block per
// (sequence, query head), one thread per output element, every thread recomputing each dot product.
// Slow; it exists as a second, GPU-side check of the optimised kernels and as documentation.
#pragma once

#include "decodegraph/attention.hpp"
#include "decodegraph/types.hpp"

namespace decodegraph::naive {

/// Same contract as paged_attention_v1 (device pointers; padded rows untouched); throws Error.
void paged_attention_v1(const DecodeArgs& args, Stream stream);

}  // namespace decodegraph::naive
