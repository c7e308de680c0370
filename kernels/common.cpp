// Value-type helpers declared in types.hpp and error.hpp: sizes, names, parsing, spec checks, the
// sticky-CUDA-error table. Host-only, no CUDA dependency (builds in every configuration).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "decodegraph/error.hpp"
#include "decodegraph/types.hpp"

namespace decodegraph {

// The cudaError_t values whose documentation says the process is left in an inconsistent state
// (every later CUDA call fails the same way; only a new process recovers), plus an uncorrectable
// ECC error, after which the driver tears the context down. Numbers, not names, so that host-only
// builds classify too; kernels/cuda_check.hpp static_asserts them against the CUDA headers.
bool cuda_error_is_sticky(int code) {
  switch (code) {
    case 214:  // cudaErrorECCUncorrectable
    case 226:  // cudaErrorContained
    case 700:  // cudaErrorIllegalAddress
    case 702:  // cudaErrorLaunchTimeout
    case 710:  // cudaErrorAssert
    case 714:  // cudaErrorHardwareStackError
    case 715:  // cudaErrorIllegalInstruction
    case 716:  // cudaErrorMisalignedAddress
    case 717:  // cudaErrorInvalidAddressSpace
    case 718:  // cudaErrorInvalidPc
    case 719:  // cudaErrorLaunchFailure
    case 911:  // cudaErrorExternalDevice
      return true;
    default:
      return false;
  }
}

namespace {

template <std::size_t N>
std::string join(const std::array<int, N>& values) {
  std::string s;
  for (std::size_t i = 0; i < N; ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

constexpr const char* kDTypeAllowed = "0 (fp16), 1 (bf16), 2 (fp32)";
constexpr const char* kLayoutAllowed = "0 (vllm), 1 (nhd)";

}  // namespace

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
  }
  throw_invalid("dtype", static_cast<int>(dtype), kDTypeAllowed);
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "fp32";
  }
  return "invalid-dtype";
}

const char* to_string(KVCacheDType kv_dtype) {
  switch (kv_dtype) {
    case KVCacheDType::kAuto: return "auto";
    case KVCacheDType::kFp8E4M3: return "fp8_e4m3";
    case KVCacheDType::kFp8E5M2: return "fp8_e5m2";
  }
  return "invalid-kv-dtype";
}

const char* to_string(KVLayout layout) {
  switch (layout) {
    case KVLayout::kVLLM: return "vllm";
    case KVLayout::kNHD: return "nhd";
  }
  return "invalid-layout";
}

const char* to_string(KernelKind kind) {
  switch (kind) {
    case KernelKind::kV1: return "v1";
    case KernelKind::kV2: return "v2";
  }
  return "invalid-kernel";
}

DType parse_dtype(const std::string& name) {
  const std::string n = lower(name);
  if (n == "fp16" || n == "float16" || n == "half") return DType::kFloat16;
  if (n == "bf16" || n == "bfloat16") return DType::kBFloat16;
  if (n == "fp32" || n == "float32" || n == "float") return DType::kFloat32;
  throw_invalid("dtype", "\"" + name + "\"",
                "fp16, float16, half, bf16, bfloat16, fp32, float32, float");
}

KVLayout parse_layout(const std::string& name) {
  const std::string n = lower(name);
  if (n == "vllm") return KVLayout::kVLLM;
  if (n == "nhd") return KVLayout::kNHD;
  throw_invalid("layout", "\"" + name + "\"", "vllm, nhd");
}

KVCacheDType parse_kv_cache_dtype(const std::string& name) {
  const std::string n = lower(name);
  if (n == "auto") return KVCacheDType::kAuto;
  if (n == "fp8" || n == "fp8_e4m3") return KVCacheDType::kFp8E4M3;
  if (n == "fp8_e5m2") return KVCacheDType::kFp8E5M2;
  throw_invalid("kv_cache_dtype", "\"" + name + "\"", "auto, fp8, fp8_e4m3, fp8_e5m2");
}

float AttentionSpec::effective_scale() const {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
}

std::size_t AttentionSpec::kv_elem_size() const { return fp8_kv() ? 1 : dtype_size(dtype); }

std::size_t AttentionSpec::block_elems() const {
  return static_cast<std::size_t>(block_size) * static_cast<std::size_t>(num_kv_heads) *
         static_cast<std::size_t>(head_size);
}

void validate_spec(const AttentionSpec& spec) {
  const auto& hs = kSupportedHeadSizes;
  require(std::find(hs.begin(), hs.end(), spec.head_size) != hs.end(), "head_size", spec.head_size,
          join(hs));
  const auto& bs = kSupportedBlockSizes;
  require(std::find(bs.begin(), bs.end(), spec.block_size) != bs.end(), "block_size",
          spec.block_size, join(bs));
  require(spec.num_kv_heads > 0, "num_kv_heads", spec.num_kv_heads, "a positive integer");
  require(spec.num_q_heads > 0, "num_q_heads", spec.num_q_heads, "a positive integer");
  require(spec.num_q_heads % spec.num_kv_heads == 0, "num_q_heads", spec.num_q_heads,
          "a multiple of num_kv_heads = " + std::to_string(spec.num_kv_heads));
  const int d = static_cast<int>(spec.dtype);
  require(d >= 0 && d <= 2, "dtype", d, kDTypeAllowed);
  const int l = static_cast<int>(spec.layout);
  require(l >= 0 && l <= 1, "layout", l, kLayoutAllowed);
  const int kv = static_cast<int>(spec.kv_dtype);
  require(kv >= 0 && kv <= 2, "kv_dtype", kv, "0 (auto), 1 (fp8_e4m3), 2 (fp8_e5m2)");
  // fp8 caches run on the fp16 tensor-core math (kernels/tensor_core_math.cuh): q converts to
  // fp16 exactly from fp16 or bf16, not from fp32.
  if (spec.fp8_kv())
    require(spec.dtype == DType::kFloat16 || spec.dtype == DType::kBFloat16, "dtype",
            std::string(to_string(spec.dtype)) + " with kv_dtype " + to_string(spec.kv_dtype),
            "fp16 or bf16 with an fp8 KV cache (fp32 pairs only with kv_dtype auto)");
  // A negative scale is a sign error in the caller, not a request for the default (0 is).
  require(std::isfinite(spec.scale) && spec.scale >= 0.0f, "spec.scale", spec.scale,
          "0 (selects 1/sqrt(head_size)) or a finite value > 0");
  require(spec.sliding_window >= 0, "spec.sliding_window", spec.sliding_window,
          "0 (no window) or W > 0 tokens (HF convention: the query attends (p - W, p]; FA's window_left = W - 1)");
  // The cap's arithmetic (kernels/decode_math.hpp, softcap2) moves each weight by up to ~4.5 x 2^-24 x
  // c of itself, and c * log2(e) must stay finite with 2 log2(e) / c: past 1e4 the first costs more
  // precision than an fp16 output holds (a cap that never binds is 0), below 1e-6 the cap is no
  // attention at all (every logit within 1e-6 of 0).
  require(spec.logit_softcap == 0.0f || (spec.logit_softcap >= kMinLogitSoftcap && spec.logit_softcap <= kMaxLogitSoftcap),
          "spec.logit_softcap", spec.logit_softcap,
          "0 (off) or c in [1e-6, 1e4] (s -> c * tanh(s / c); larger caps lose precision, models use 30-50)");
}

}  // namespace decodegraph
