// Arrays in and out of the binding. Every array argument comes in as a Python object and goes through
// import_tensor(), which accepts DLPack (__dlpack__: numpy, torch, cupy, jax), the CUDA array
// interface and the buffer protocol, plus numpy arrays of ml_dtypes.bfloat16, float8_e4m3fn and
// float8_e5m2 (which numpy cannot export through DLPack). The checks below name the argument, its value and what is allowed, in the
// library's own InvalidArgument format, so a bad array reads like any other bad input.
//
// A Tensor keeps what it was imported from alive: hold the Tensor for as long as its memory is used.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <vector>

#include "decodegraph/types.hpp"

namespace dgpy {

namespace nb = nanobind;
namespace dg = decodegraph;

/// Where an array's memory lives, as far as the library cares.
enum class Where { kHost, kCuda };

/// Element types the binding deals in: the attention dtypes, the fp8 cache codes, plus the index
/// and byte types.
enum class Elem { kFp16, kBf16, kFp32, kInt32, kInt64, kUInt8, kFp8E4M3, kFp8E5M2, kOther };

const char* elem_name(Elem e);
Elem elem_of(dg::DType dtype);
/// The fp8 element of a cache type (kOther for kAuto).
Elem elem_of(dg::KVCacheDType kv);

/// One imported array: a borrowed view of the caller's memory.
struct Tensor {
  std::string name;  // the argument, for messages: "q", "layers[1].k_cache"
  void* data = nullptr;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements
  Elem elem = Elem::kOther;
  std::string dtype_text;  // the producer's dtype, for messages
  Where where = Where::kHost;
  int device_id = 0;
  // What keeps the memory alive: the nanobind ndarray (DLPack / buffer protocol imports) or the
  // object exposing __cuda_array_interface__.
  nb::ndarray<nb::ro> keep_ro;
  nb::ndarray<> keep_rw;
  nb::object keep_obj;

  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;
  std::size_t itemsize() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * itemsize(); }
  std::string shape_text() const;
};

/// Imports `obj` as an array named `name`. `writable`: the call writes it (a read-only array is
/// rejected). Throws InvalidArgument naming `name` for None or anything that is not an array.
Tensor import_tensor(nb::handle obj, std::string name, bool writable);

// ---------------------------------------------------------------- checks (all throw InvalidArgument)

void require_elem(const Tensor& t, Elem want, const std::string& why);
/// A KV cache of `spec`: the model dtype for kv_dtype auto; for fp8 caches the matching fp8 element
/// type or uint8 (raw codes, as vLLM stores them).
void require_cache_elem(const Tensor& t, const dg::AttentionSpec& spec, const std::string& why);
/// Host memory (CPU or pinned) or CUDA device memory (device or managed) on `device_id`.
void require_where(const Tensor& t, Where want, int device_id, const std::string& why);
void require_same_where(const Tensor& t, const Tensor& ref);
/// Exact shape; -1 in `want` matches any extent. `what` spells the expected shape in words.
void require_shape(const Tensor& t, const std::vector<int64_t>& want, const std::string& what);
/// Row-major and dense (strides of extent-1 dimensions are ignored).
void require_contiguous(const Tensor& t);

/// A [rows, heads, head_size] or [rows, heads * head_size] array whose rows may be any number of
/// elements apart (a slice of a fused QKV buffer) but whose heads and elements are packed. With
/// `allow_4d`, also [seqs, n, heads, head_size] (speculative steps: n rows per sequence, row (s, j)
/// = row s * n + j), whose rows must then be evenly spaced across sequences too.
struct RowArray {
  int64_t rows = 0;        // every row: seqs x n for a 4-D array
  int64_t row_stride = 0;  // elements between rows; 0 = packed (heads * head_size)
  int64_t per_seq = 0;     // 4-D: shape[1] (n); 0 for 2-D and 3-D arrays
};
RowArray require_rows(const Tensor& t, int64_t heads, int64_t head_size, const std::string& what,
                      bool allow_4d = false);

/// The shape a KV cache of `spec` has in its layout (types.hpp): K and V differ under kVLLM.
std::vector<int64_t> cache_shape(const dg::AttentionSpec& spec, int64_t num_blocks, bool key);
std::string cache_shape_text(const dg::AttentionSpec& spec, bool key);

// ---------------------------------------------------------------- out

/// A zero-copy view of library memory as a Python object with __dlpack__, __dlpack_device__ and
/// (host memory) the buffer protocol, keeping `owner` alive. bf16 host views are exported as
/// uint16 (numpy has no bf16; the Python layer reinterprets them as ml_dtypes.bfloat16).
nb::object export_view(void* data, const std::vector<std::size_t>& shape, Elem elem, Where where,
                       int device_id, nb::handle owner);

/// A stream argument: None -> nullptr, an int handle, an object with an int `cuda_stream` attribute
/// (torch.cuda.Stream) or a `__cuda_stream__()` method (CUDA Python's protocol).
dg::Stream stream_from_py(nb::handle obj, bool* given = nullptr);

/// The current CUDA device (CUDA builds; 0 otherwise).
int current_cuda_device();

}  // namespace dgpy
