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

/// Element type of q and the output (the model dtype), and of the KV cache unless
/// AttentionSpec::kv_dtype says otherwise.
enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

/// Element type of the KV cache, named after vLLM's `kv_cache_dtype` strings (parse_kv_cache_dtype).
///  kAuto:    the model dtype (AttentionSpec::dtype): "auto".
///  kFp8E4M3: OCP E4M3FN, 1-4-3, bias 7, max 448, no infinities, NaN = S.1111.111: "fp8" and
///            "fp8_e4m3" (vLLM's "fp8" is this one).
///  kFp8E5M2: 1-5-2, bias 15, max 57344, IEEE-style infinities and NaN: "fp8_e5m2".
/// An fp8 cache holds codes c with K = float(c) * k_scale and V = float(c) * v_scale, the scales
/// fp32 values in memory read at run time (DecodeArgs / AppendArgs / LayerBuffers::k_scale,
/// v_scale); the model dtype must be fp16 or bf16. docs/design.md ("fp8 KV caches") has the exact
/// semantics of the append's quantisation and of NaN and inf.
enum class KVCacheDType : int { kAuto = 0, kFp8E4M3 = 1, kFp8E5M2 = 2 };

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
/// "auto", "fp8_e4m3" or "fp8_e5m2" (vLLM's names; parse_kv_cache_dtype also takes "fp8").
const char* to_string(KVCacheDType kv_dtype);
const char* to_string(KVLayout layout);
const char* to_string(KernelKind kind);
/// Parses "fp16"/"float16"/"half", "bf16"/"bfloat16", "fp32"/"float32"/"float" (any case); throws
/// InvalidArgument otherwise.
DType parse_dtype(const std::string& name);
/// Parses "vllm" or "nhd" (any case); throws InvalidArgument otherwise.
KVLayout parse_layout(const std::string& name);
/// Parses vLLM's kv_cache_dtype strings "auto", "fp8" (= "fp8_e4m3"), "fp8_e4m3", "fp8_e5m2" (any
/// case); throws InvalidArgument otherwise.
KVCacheDType parse_kv_cache_dtype(const std::string& name);

/// The soft-caps AttentionSpec::logit_softcap accepts besides 0: the kernels' tanh (approximate exp2
/// and reciprocal) moves each weight by up to ~4.5 x 2^-24 x c of itself, so a cap past 1e4 costs more
/// precision than an fp16 output holds; below 1e-6 every logit lies within 1e-6 of 0.
inline constexpr float kMinLogitSoftcap = 1e-6f;
inline constexpr float kMaxLogitSoftcap = 1e4f;

/// The static shape of one attention layer.
struct AttentionSpec {
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int head_size = 128;
  int block_size = 16;
  /// q and out (the model dtype); also the KV cache's when kv_dtype is kAuto.
  DType dtype = DType::kBFloat16;
  KVLayout layout = KVLayout::kVLLM;
  /// Softmax scale applied to q.k. 0 (the default) selects 1/sqrt(head_size); otherwise a finite
  /// value > 0. validate_spec rejects a negative or non-finite scale with InvalidArgument.
  float scale = 0.0f;
  /// The KV cache's element type (kAuto: dtype). fp8 needs dtype fp16 or bf16 and scales.
  KVCacheDType kv_dtype = KVCacheDType::kAuto;
  /// fp8 caches: k_scale / v_scale hold one fp32 value per KV head ([num_kv_heads], as vLLM and FA3
  /// allow) instead of one for the layer. Ignored for kAuto.
  bool kv_scale_per_head = false;
  /// Sliding window W, the HF `sliding_window` / TensorRT-LLM convention: the query at position
  /// p = L - 1 (L counting this step's token) attends positions t in (p - W, p], W tokens including
  /// its own. 0 = no window. FlashInfer's and FA's `window_left` is W - 1. Blocks wholly before the
  /// window are never read, neither their block-table entries nor their data.
  int sliding_window = 0;
  /// Logit soft-cap c: each logit s = scale * q.k (+ ALiBi bias) becomes c * tanh(s / c), before
  /// any mask. 0 = off; otherwise kMinLogitSoftcap <= c <= kMaxLogitSoftcap (models use 30-50).
  float logit_softcap = 0.0f;

  /// scale, or 1/sqrt(head_size) when scale is 0.
  float effective_scale() const;
  int group_size() const { return num_q_heads / num_kv_heads; }
  /// Elements of one KV block for one layer, K or V: block_size * kv_heads * head_size.
  std::size_t block_elems() const;
  /// An fp8 cache (kv_dtype kFp8E4M3 or kFp8E5M2).
  bool fp8_kv() const { return kv_dtype != KVCacheDType::kAuto; }
  /// Bytes of one KV cache element: 1 for fp8, else dtype_size(dtype).
  std::size_t kv_elem_size() const;
  /// Bytes of one KV block for one layer, K or V: block_elems() * kv_elem_size().
  std::size_t block_bytes() const { return block_elems() * kv_elem_size(); }
  /// fp32 values behind each of k_scale and v_scale: num_kv_heads when kv_scale_per_head, else 1.
  int kv_scale_count() const { return kv_scale_per_head ? num_kv_heads : 1; }
  /// Field by field (a scale of 0 and an explicit 1/sqrt(head_size) differ). The executor groups
  /// layers whose specs are equal (ExecutorConfig::layer_specs).
  friend bool operator==(const AttentionSpec&, const AttentionSpec&) = default;
};

/// Throws InvalidArgument for any unsupported value of the spec (head_size, block_size, heads,
/// dtype, layout, kv_dtype and its pairing with dtype, scale, sliding_window, logit_softcap).
void validate_spec(const AttentionSpec& spec);

}  // namespace decodegraph
