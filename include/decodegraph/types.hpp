// Core value types shared by the eager API, the executor and the host implementation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

// Forward declaration so public headers need no CUDA headers; identical to cudaStream_t.
struct CUstream_st;

namespace decodegraph {

/// A CUDA stream handle (cudaStream_t). nullptr is the legacy default stream.
using Stream = CUstream_st*;

/// Element type of q, the KV cache and the output (they always share it).
enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

/// Paged KV cache layouts.
///  kVLLM: K [num_blocks, kv_heads, head_size/x, block_size, x] with x = 16 bytes / element size,
///         V [num_blocks, kv_heads, head_size, block_size].
///  kNHD:  K and V each [num_blocks, block_size, kv_heads, head_size].
enum class KVLayout : int { kVLLM = 0, kNHD = 1 };

/// Which kernel a plan or step ran.
enum class KernelKind : int { kV1 = 0, kV2 = 1 };

inline constexpr std::array<int, 7> kSupportedHeadSizes = {64, 80, 96, 112, 128, 192, 256};
inline constexpr std::array<int, 3> kSupportedBlockSizes = {8, 16, 32};

std::size_t dtype_size(DType dtype);
const char* to_string(DType dtype);
const char* to_string(KVLayout layout);
const char* to_string(KernelKind kind);
/// Parses "fp16"/"float16"/"half", "bf16"/"bfloat16", "fp32"/"float32"/"float" (any case); throws
/// InvalidArgument otherwise.
DType parse_dtype(const std::string& name);
/// Parses "vllm" or "nhd" (any case); throws InvalidArgument otherwise.
KVLayout parse_layout(const std::string& name);

/// The static shape of one attention layer.
struct AttentionSpec {
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int head_size = 128;
  int block_size = 16;
  DType dtype = DType::kBFloat16;
  KVLayout layout = KVLayout::kVLLM;
  /// Softmax scale applied to q.k. 0 (the default) selects 1/sqrt(head_size); otherwise a finite
  /// value > 0. validate_spec rejects a negative or non-finite scale with InvalidArgument.
  float scale = 0.0f;

  /// scale, or 1/sqrt(head_size) when scale is 0.
  float effective_scale() const;
  int group_size() const { return num_q_heads / num_kv_heads; }
  /// Elements of one KV block for one layer, K or V: block_size * kv_heads * head_size.
  std::size_t block_elems() const;
  /// Field by field (a scale of 0 and an explicit 1/sqrt(head_size) differ). The executor groups
  /// layers whose specs are equal (ExecutorConfig::layer_specs).
  friend bool operator==(const AttentionSpec&, const AttentionSpec&) = default;
};

/// Throws InvalidArgument for any unsupported value of the spec (head_size, block_size, heads,
/// dtype, layout, scale).
void validate_spec(const AttentionSpec& spec);

}  // namespace decodegraph
