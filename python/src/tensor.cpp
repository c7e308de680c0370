// Array import, checks and export (tensor.hpp).
#include "tensor.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "decodegraph/error.hpp"

#if DECODEGRAPH_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dgpy {
namespace {

using dg::throw_invalid;
namespace dl = nb::dlpack;

// DLPack device types (dlpack.h): what the library can address.
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

std::string dl_dtype_text(dl::dtype d) {
  const char* kind = "dtype-code-";
  switch (static_cast<dl::dtype_code>(d.code)) {
    case dl::dtype_code::Int: kind = "int"; break;
    case dl::dtype_code::UInt: kind = "uint"; break;
    case dl::dtype_code::Float: kind = "float"; break;
    case dl::dtype_code::Bfloat: kind = "bfloat"; break;
    case dl::dtype_code::Complex: kind = "complex"; break;
    case dl::dtype_code::Bool: return "bool";
    default: return "dlpack dtype code " + std::to_string(d.code);
  }
  std::string s = kind + std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

Elem elem_of_dl(dl::dtype d) {
  if (d.lanes != 1) return Elem::kOther;
  switch (static_cast<dl::dtype_code>(d.code)) {
    case dl::dtype_code::Float:
      return d.bits == 16 ? Elem::kFp16 : d.bits == 32 ? Elem::kFp32 : Elem::kOther;
    case dl::dtype_code::Bfloat: return d.bits == 16 ? Elem::kBf16 : Elem::kOther;
    case dl::dtype_code::Int:
      return d.bits == 32 ? Elem::kInt32 : d.bits == 64 ? Elem::kInt64 : Elem::kOther;
    case dl::dtype_code::UInt: return d.bits == 8 ? Elem::kUInt8 : Elem::kOther;
    default: break;
  }
  // DLPack 1.0's fp8 codes (dlpack.h: kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12).
  if (d.bits == 8 && d.code == 10) return Elem::kFp8E4M3;
  if (d.bits == 8 && d.code == 12) return Elem::kFp8E5M2;
  return Elem::kOther;
}

dl::dtype dl_of(Elem e) {
  switch (e) {
    case Elem::kFp16: return {(uint8_t)dl::dtype_code::Float, 16, 1};
    case Elem::kBf16: return {(uint8_t)dl::dtype_code::Bfloat, 16, 1};
    case Elem::kFp32: return {(uint8_t)dl::dtype_code::Float, 32, 1};
    case Elem::kInt32: return {(uint8_t)dl::dtype_code::Int, 32, 1};
    case Elem::kInt64: return {(uint8_t)dl::dtype_code::Int, 64, 1};
    case Elem::kUInt8: return {(uint8_t)dl::dtype_code::UInt, 8, 1};
    case Elem::kFp8E4M3: return {10, 8, 1};
    case Elem::kFp8E5M2: return {12, 8, 1};
    case Elem::kOther: break;
  }
  return {};
}

std::string where_text(Where w, int device_id) {
  return w == Where::kHost ? "host" : "cuda:" + std::to_string(device_id);
}

// numpy cannot export ml_dtypes' bfloat16 and float8 types through DLPack or a standard buffer
// format: such an array is imported through a uint16 / uint8 view of the same memory. Returns the
// element it holds (kOther: not one of them). ml_dtypes' types are user-defined numpy dtypes
// (dtype.num >= NPY_USERDEF = 256), numpy's own are below: dtype.num costs ~0.05 us, dtype.name
// 2-4 us (it is built anew each time), so the name is read for user-defined dtypes only.
Elem numpy_ml_dtype(nb::handle obj) {
  if (std::strcmp(Py_TYPE(obj.ptr())->tp_name, "numpy.ndarray") != 0) return Elem::kOther;
  nb::object dtype = obj.attr("dtype");
  constexpr int kNpyUserDef = 256;
  if (nb::cast<int>(dtype.attr("num")) < kNpyUserDef) return Elem::kOther;
  const std::string name = nb::cast<std::string>(dtype.attr("name"));
  const int size = nb::cast<int>(dtype.attr("itemsize"));
  if (name == "bfloat16" && size == 2) return Elem::kBf16;
  if (name == "float8_e4m3fn" && size == 1) return Elem::kFp8E4M3;
  if (name == "float8_e5m2" && size == 1) return Elem::kFp8E5M2;
  return Elem::kOther;
}

template <typename Array>
void fill_from(Tensor& t, const Array& a) {
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.shape.assign(a.shape_ptr(), a.shape_ptr() + a.ndim());
  t.strides.assign(a.stride_ptr(), a.stride_ptr() + a.ndim());
  t.elem = elem_of_dl(a.dtype());
  t.dtype_text = dl_dtype_text(a.dtype());
  const int dev = a.device_type();
  if (dev == kDLCPU || dev == kDLCUDAHost) {
    t.where = Where::kHost;
  } else if (dev == kDLCUDA || dev == kDLCUDAManaged) {
    t.where = Where::kCuda;
  } else {
    throw_invalid(t.name + ".device", "DLPack device type " + std::to_string(dev),
                  "host memory or CUDA memory");
  }
  t.device_id = a.device_id();
}

// __cuda_array_interface__ (version 2 or 3): shape, typestr, data = (pointer, read-only), strides in
// bytes or None (packed), and optionally the producer's stream, which the consumer must wait for.
void fill_from_cai(Tensor& t, nb::handle obj, bool writable) {
  nb::dict d = nb::cast<nb::dict>(obj.attr("__cuda_array_interface__"));
  t.shape = nb::cast<std::vector<int64_t>>(d["shape"]);
  const std::string typestr = nb::cast<std::string>(d["typestr"]);
  nb::tuple data = nb::cast<nb::tuple>(d["data"]);
  t.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(data[0]));
  if (writable && nb::cast<bool>(data[1]))
    throw_invalid(t.name, "a read-only array", "a writable array (it is written)");
  const std::string kind = typestr.size() >= 3 ? typestr.substr(1) : typestr;
  t.elem = kind == "f2" ? Elem::kFp16 : kind == "f4" ? Elem::kFp32 : kind == "i4" ? Elem::kInt32
         : kind == "i8" ? Elem::kInt64 : kind == "u1" ? Elem::kUInt8 : Elem::kOther;
  t.dtype_text = "typestr " + typestr;
  const std::size_t item = t.elem == Elem::kOther ? 1 : t.itemsize();
  t.strides.assign(t.shape.size(), 0);
  if (d.contains("strides") && !d["strides"].is_none()) {
    auto bytes = nb::cast<std::vector<int64_t>>(d["strides"]);
    for (std::size_t i = 0; i < bytes.size() && i < t.strides.size(); ++i) {
      if (bytes[i] % static_cast<int64_t>(item) != 0)
        throw_invalid(t.name + ".strides", bytes[i], "whole elements");
      t.strides[i] = bytes[i] / static_cast<int64_t>(item);
    }
  } else {
    int64_t acc = 1;
    for (int i = t.ndim() - 1; i >= 0; --i) {
      t.strides[i] = acc;
      acc *= t.shape[i];
    }
  }
  t.where = Where::kCuda;
  t.keep_obj = nb::borrow(obj);
#if DECODEGRAPH_HAS_CUDA
  cudaPointerAttributes attr{};
  if (t.data && cudaPointerGetAttributes(&attr, t.data) == cudaSuccess) t.device_id = attr.device;
  cudaGetLastError();
  // The protocol's stream: the producer's pending work on it must finish before we read the data.
  if (d.contains("stream") && !d["stream"].is_none()) {
    const auto s = nb::cast<uintptr_t>(d["stream"]);
    if (s != 0) {
      nb::gil_scoped_release nogil;
      cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s));
    }
  }
#endif
}

}  // namespace

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::kFp16: return "float16";
    case Elem::kBf16: return "bfloat16";
    case Elem::kFp32: return "float32";
    case Elem::kInt32: return "int32";
    case Elem::kInt64: return "int64";
    case Elem::kUInt8: return "uint8";
    case Elem::kFp8E4M3: return "float8_e4m3fn";
    case Elem::kFp8E5M2: return "float8_e5m2";
    case Elem::kOther: break;
  }
  return "other";
}

Elem elem_of(dg::DType dtype) {
  switch (dtype) {
    case dg::DType::kFloat16: return Elem::kFp16;
    case dg::DType::kBFloat16: return Elem::kBf16;
    case dg::DType::kFloat32: return Elem::kFp32;
  }
  return Elem::kOther;
}

Elem elem_of(dg::KVCacheDType kv) {
  switch (kv) {
    case dg::KVCacheDType::kFp8E4M3: return Elem::kFp8E4M3;
    case dg::KVCacheDType::kFp8E5M2: return Elem::kFp8E5M2;
    case dg::KVCacheDType::kAuto: break;
  }
  return Elem::kOther;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::size_t Tensor::itemsize() const {
  switch (elem) {
    case Elem::kFp16: case Elem::kBf16: return 2;
    case Elem::kFp32: case Elem::kInt32: return 4;
    case Elem::kInt64: return 8;
    case Elem::kUInt8: case Elem::kFp8E4M3: case Elem::kFp8E5M2: return 1;
    case Elem::kOther: break;
  }
  return 1;
}

std::string Tensor::shape_text() const {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

Tensor import_tensor(nb::handle obj, std::string name, bool writable) {
  Tensor t;
  t.name = std::move(name);
  if (!obj.is_valid() || obj.is_none())
    throw_invalid(t.name, "None", "an array (numpy, torch, or any object with __dlpack__, "
                                  "__cuda_array_interface__ or the buffer protocol)");
  nb::handle src = obj;
  nb::object raw_view;
  const Elem ml = numpy_ml_dtype(obj);
  if (ml != Elem::kOther) {
    raw_view = obj.attr("view")(ml == Elem::kBf16 ? "uint16" : "uint8");
    src = raw_view;
  }
  if (writable ? nb::try_cast(src, t.keep_rw, false) : nb::try_cast(src, t.keep_ro, false)) {
    if (writable) fill_from(t, t.keep_rw); else fill_from(t, t.keep_ro);
    if (ml != Elem::kOther) {
      t.elem = ml;
      t.dtype_text = elem_name(ml);
    }
    return t;
  }
  if (nb::hasattr(obj, "__cuda_array_interface__")) {
    fill_from_cai(t, obj, writable);
    return t;
  }
  if (writable && nb::try_cast(src, t.keep_ro, false))
    throw_invalid(t.name, "a read-only array", "a writable array (it is written)");
  if (nb::hasattr(src, "__dlpack__")) {
    // The producer refused the export (a torch tensor that requires grad, say): say why.
    try {
      src.attr("__dlpack__")();
    } catch (nb::python_error& e) {
      throw_invalid(t.name, std::string("an array whose __dlpack__() failed (") + nb::str(e.value()).c_str() + ")",
                    "an exportable array");
    }
  }
  throw_invalid(t.name, std::string("an object of type ") + Py_TYPE(obj.ptr())->tp_name,
                "an array (numpy, torch, or any object with __dlpack__, "
                "__cuda_array_interface__ or the buffer protocol)");
}

void require_elem(const Tensor& t, Elem want, const std::string& why) {
  if (t.elem != want) throw_invalid(t.name + ".dtype", t.dtype_text, std::string(elem_name(want)) + why);
}

void require_cache_elem(const Tensor& t, const dg::AttentionSpec& s, const std::string& why) {
  if (!s.fp8_kv()) return require_elem(t, elem_of(s.dtype), why);
  const Elem want = elem_of(s.kv_dtype);
  if (t.elem != want && t.elem != Elem::kUInt8)
    throw_invalid(t.name + ".dtype", t.dtype_text,
                  std::string(elem_name(want)) + " or uint8 (raw codes) for kv_dtype " + dg::to_string(s.kv_dtype) + why);
}

void require_where(const Tensor& t, Where want, int device_id, const std::string& why) {
  if (t.where != want || (want == Where::kCuda && t.device_id != device_id))
    throw_invalid(t.name + ".device", where_text(t.where, t.device_id),
                  (want == Where::kHost ? std::string("host memory") : "CUDA memory on " +
                                                                           where_text(want, device_id)) + why);
}

void require_same_where(const Tensor& t, const Tensor& ref) {
  if (t.where != ref.where || (t.where == Where::kCuda && t.device_id != ref.device_id))
    throw_invalid(t.name + ".device", where_text(t.where, t.device_id),
                  where_text(ref.where, ref.device_id) + ", where " + ref.name + " is");
}

void require_shape(const Tensor& t, const std::vector<int64_t>& want, const std::string& what) {
  bool ok = t.shape.size() == want.size();
  for (std::size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || want[i] == t.shape[i];
  if (!ok) throw_invalid(t.name + ".shape", t.shape_text(), what);
}

void require_contiguous(const Tensor& t) {
  int64_t acc = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != acc) {
      std::string s = "(";
      for (int j = 0; j < t.ndim(); ++j) s += (j ? ", " : "") + std::to_string(t.strides[j]);
      throw_invalid(t.name + ".strides", s + (t.ndim() == 1 ? ",)" : ")") + " elements",
                    "a contiguous (row-major, dense) array");
    }
    acc *= t.shape[i];
  }
}

RowArray require_rows(const Tensor& t, int64_t heads, int64_t head_size, const std::string& what,
                      bool allow_4d) {
  const int64_t row = heads * head_size;
  std::string shape_words = "[" + what + ", " + std::to_string(heads) + ", " + std::to_string(head_size) + "] or [" +
                            what + ", " + std::to_string(row) + "]";
  if (allow_4d) shape_words += " or [num_seqs, q_len, " + std::to_string(heads) + ", " + std::to_string(head_size) + "]";
  RowArray r;
  int64_t stride = row;  // between consecutive rows, as the library reads them
  if (t.ndim() == 4 && allow_4d) {
    require_shape(t, {-1, -1, heads, head_size}, shape_words);
    if ((head_size > 1 && t.strides[3] != 1) || (heads > 1 && t.strides[2] != head_size))
      throw_invalid(t.name + ".strides", std::to_string(t.strides[2]) + ", " + std::to_string(t.strides[3]) +
                                             " elements (heads, elements)",
                    "heads and elements packed (strides[2] = head_size, strides[3] = 1); only rows may be "
                    "strided");
    r.rows = t.shape[0] * t.shape[1];
    r.per_seq = t.shape[1];
    // Row (s, j) is read at (s * n + j) * stride: one stride across tokens and sequences.
    if (t.shape[1] > 1) stride = t.strides[1];
    else if (t.shape[0] > 1) stride = t.strides[0];
    if (t.shape[0] > 1 && t.shape[1] > 1 && t.strides[0] != t.shape[1] * t.strides[1])
      throw_invalid(t.name + ".strides[0]", t.strides[0],
                    "shape[1] x strides[1] = " + std::to_string(t.shape[1] * t.strides[1]) +
                        " (row (s, j) is row s * q_len + j: rows evenly spaced across sequences)");
  } else if (t.ndim() == 3) {
    require_shape(t, {-1, heads, head_size}, shape_words);
    if ((head_size > 1 && t.strides[2] != 1) || (heads > 1 && t.strides[1] != head_size))
      throw_invalid(t.name + ".strides", std::to_string(t.strides[1]) + ", " + std::to_string(t.strides[2]) +
                                             " elements (heads, elements)",
                    "heads and elements packed (strides[1] = head_size, strides[2] = 1); only rows may be "
                    "strided");
    r.rows = t.shape[0];
    if (t.shape[0] > 1) stride = t.strides[0];
  } else if (t.ndim() == 2) {
    require_shape(t, {-1, row}, shape_words);
    if (row > 1 && t.strides[1] != 1)
      throw_invalid(t.name + ".strides[1]", t.strides[1], "1 (elements packed; only rows may be strided)");
    r.rows = t.shape[0];
    if (t.shape[0] > 1) stride = t.strides[0];
  } else {
    throw_invalid(t.name + ".shape", t.shape_text(), shape_words);
  }
  if (stride < row)
    throw_invalid(t.name + ".strides[" + std::string(t.ndim() == 4 && t.shape[1] > 1 ? "1" : "0") + "]", stride,
                  "at least one row (" + std::to_string(row) + " elements)");
  if (stride != row && (stride * static_cast<int64_t>(t.itemsize())) % 16 != 0)
    throw_invalid(t.name + ".strides[" + std::string(t.ndim() == 4 && t.shape[1] > 1 ? "1" : "0") + "]", stride,
                  "a row stride that is a multiple of 16 bytes");
  r.row_stride = stride == row ? 0 : stride;
  return r;
}

std::vector<int64_t> cache_shape(const dg::AttentionSpec& s, int64_t num_blocks, bool key) {
  if (s.layout == dg::KVLayout::kNHD) return {num_blocks, s.block_size, s.num_kv_heads, s.head_size};
  const int64_t x = 16 / static_cast<int64_t>(s.kv_elem_size());
  if (key) return {num_blocks, s.num_kv_heads, s.head_size / x, s.block_size, x};
  return {num_blocks, s.num_kv_heads, s.head_size, s.block_size};
}

std::string cache_shape_text(const dg::AttentionSpec& s, bool key) {
  const auto shape = cache_shape(s, -1, key);
  std::string text = "[num_blocks";
  for (std::size_t i = 1; i < shape.size(); ++i) text += ", " + std::to_string(shape[i]);
  text += "]";
  if (s.layout == dg::KVLayout::kNHD) return text + " (nhd layout: num_blocks, block_size, kv_heads, head_size)";
  return text + (key ? " (vllm layout: num_blocks, kv_heads, head_size/x, block_size, x; x = 16 bytes / element)"
                     : " (vllm layout: num_blocks, kv_heads, head_size, block_size)");
}

nb::object export_view(void* data, const std::vector<std::size_t>& shape, Elem elem, Where where,
                       int device_id, nb::handle owner) {
  dl::dtype dt = dl_of(elem);
  if (where == Where::kHost && elem == Elem::kBf16) dt = {(uint8_t)dl::dtype_code::UInt, 16, 1};
  nb::ndarray<nb::array_api> view(data, shape.size(), shape.data(), owner, nullptr, dt,
                                  where == Where::kHost ? kDLCPU : kDLCUDA, device_id);
  return nb::cast(view, nb::rv_policy::reference);
}

dg::Stream stream_from_py(nb::handle obj, bool* given) {
  if (given) *given = !(obj.is_none());
  if (obj.is_none()) return nullptr;
  uintptr_t h = 0;
  if (nb::isinstance<nb::int_>(obj)) {
    h = nb::cast<uintptr_t>(obj);
  } else if (nb::hasattr(obj, "__cuda_stream__")) {
    nb::tuple t = nb::cast<nb::tuple>(obj.attr("__cuda_stream__")());
    h = nb::cast<uintptr_t>(t[1]);
  } else if (nb::hasattr(obj, "cuda_stream")) {
    h = nb::cast<uintptr_t>(obj.attr("cuda_stream"));
  } else {
    throw_invalid("stream", std::string("an object of type ") + Py_TYPE(obj.ptr())->tp_name,
                  "None, an int cudaStream_t handle, or a stream object with .cuda_stream (torch) or "
                  "__cuda_stream__()");
  }
  return reinterpret_cast<dg::Stream>(h);
}

int current_cuda_device() {
#if DECODEGRAPH_HAS_CUDA
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return dev;
#else
  return 0;
#endif
}

}  // namespace dgpy
