// The eager calls: paged_attention_v1, paged_attention_v2, append_kv, v2_workspace_size. The spec
// comes from the arrays' shapes (the layout from k_cache's rank: 5 = vllm, 4 = nhd), the model dtype
// from q (key), the cache dtype from k_cache (fp8 arrays) or kv_cache_dtype (uint8 codes). Host arrays
// run the host implementation (host::), with the GIL released; CUDA arrays run the CUDA launchers
// on `stream` (capturable: nothing is allocated or read back).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "convert.hpp"
#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "tensor.hpp"

namespace dgpy {
namespace {

using dg::throw_invalid;

// The spec a K cache of this rank and shape implies. num_q_heads 0: as many as KV heads (append);
// head_size 0: the cache's own.
dg::AttentionSpec spec_from_cache(const Tensor& k_cache, dg::DType dtype, int num_q_heads, int head_size) {
  dg::AttentionSpec s;
  s.dtype = dtype;
  s.num_q_heads = num_q_heads;
  if (k_cache.ndim() == 5) {  // [num_blocks, kv_heads, head_size/x, block_size, x]
    s.layout = dg::KVLayout::kVLLM;
    s.num_kv_heads = static_cast<int>(k_cache.shape[1]);
    s.head_size = head_size > 0 ? head_size : static_cast<int>(k_cache.shape[2] * k_cache.shape[4]);
    s.block_size = static_cast<int>(k_cache.shape[3]);
  } else if (k_cache.ndim() == 4) {  // [num_blocks, block_size, kv_heads, head_size]
    s.layout = dg::KVLayout::kNHD;
    s.block_size = static_cast<int>(k_cache.shape[1]);
    s.num_kv_heads = static_cast<int>(k_cache.shape[2]);
    s.head_size = head_size > 0 ? head_size : static_cast<int>(k_cache.shape[3]);
  } else {
    throw_invalid(k_cache.name + ".shape", k_cache.shape_text(),
                  "5 dimensions [num_blocks, kv_heads, head_size/x, block_size, x] (vllm layout) or 4 "
                  "[num_blocks, block_size, kv_heads, head_size] (nhd layout)");
  }
  if (num_q_heads <= 0) s.num_q_heads = s.num_kv_heads;
  return s;
}

// validate_spec on a spec read off the arrays: the message says which arrays it came from.
void validate_inferred(const dg::AttentionSpec& s, const Tensor& a, const Tensor& b) {
  try {
    dg::validate_spec(s);
  } catch (const dg::InvalidArgument& e) {
    throw dg::InvalidArgument(std::string(e.what()) + " (read from the shapes of " + a.name + " " + a.shape_text() +
                              " and " + b.name + " " + b.shape_text() + ")");
  }
}

dg::DType dtype_of(const Tensor& t) {
  switch (t.elem) {
    case Elem::kFp16: return dg::DType::kFloat16;
    case Elem::kBf16: return dg::DType::kBFloat16;
    case Elem::kFp32: return dg::DType::kFloat32;
    default: throw_invalid(t.name + ".dtype", t.dtype_text, "float16, bfloat16 or float32");
  }
}

// The cache dtype: k_cache's own (an fp8 array), else `given` (kv_cache_dtype, vLLM's names), which
// a uint8 array of raw codes needs.
dg::KVCacheDType kv_of(const Tensor& k, const std::string& given) {
  const dg::KVCacheDType named = dg::parse_kv_cache_dtype(given);
  const dg::KVCacheDType own = k.elem == Elem::kFp8E4M3   ? dg::KVCacheDType::kFp8E4M3
                               : k.elem == Elem::kFp8E5M2 ? dg::KVCacheDType::kFp8E5M2
                                                          : dg::KVCacheDType::kAuto;
  if (own != dg::KVCacheDType::kAuto) {
    if (named != dg::KVCacheDType::kAuto && named != own)
      throw_invalid("kv_cache_dtype", "\"" + given + "\"",
                    std::string("\"auto\" or \"") + dg::to_string(own) + "\" for " + k.name + " of dtype " + k.dtype_text);
    return own;
  }
  if (k.elem == Elem::kUInt8 && named == dg::KVCacheDType::kAuto)
    throw_invalid(k.name + ".dtype", k.dtype_text,
                  "the model dtype, an fp8 dtype, or uint8 codes with kv_cache_dtype=\"fp8_e4m3\" or \"fp8_e5m2\"");
  return named;
}

// fp8 caches: float32 [1] (the layer's) or [num_kv_heads] (per KV head) scales, on ref's device;
// they set s.kv_scale_per_head. Nothing for kv_dtype auto (given scales are ignored there, as in C++).
void import_scales(nb::handle k_scale, nb::handle v_scale, dg::AttentionSpec& s, const Tensor& ref, Tensor& ks,
                   Tensor& vs) {
  if (!s.fp8_kv()) return;
  const std::string allowed = "float32 [1] or [num_kv_heads] = [" + std::to_string(s.num_kv_heads) +
                              "] (required with kv_cache_dtype " + dg::to_string(s.kv_dtype) + ")";
  int64_t count = -1;
  for (auto [obj, t, name] : {std::tuple{k_scale, &ks, "k_scale"}, std::tuple{v_scale, &vs, "v_scale"}}) {
    if (obj.is_none()) throw_invalid(name, "None", allowed);
    *t = import_tensor(obj, name, false);
    require_elem(*t, Elem::kFp32, "");
    require_same_where(*t, ref);
    if (t->ndim() != 1 || (t->shape[0] != 1 && t->shape[0] != s.num_kv_heads))
      throw_invalid(std::string(name) + ".shape", t->shape_text(), allowed);
    require_contiguous(*t);
    if (count >= 0 && t->shape[0] != count)
      throw_invalid("v_scale.shape", t->shape_text(), "k_scale's shape " + ks.shape_text());
    count = t->shape[0];
  }
  s.kv_scale_per_head = count > 1;
}

// Both caches: the spec's shape, its dtype, on the reference array's device, contiguous.
void check_caches(const Tensor& k, const Tensor& v, const dg::AttentionSpec& s, const Tensor& ref) {
  const std::string why = ", as " + ref.name;
  for (const Tensor* t : {&k, &v}) {
    require_cache_elem(*t, s, why);
    require_same_where(*t, ref);
    require_shape(*t, cache_shape(s, k.shape[0], t == &k), cache_shape_text(s, t == &k));
    require_contiguous(*t);
  }
}

void check_index(const Tensor& t, Elem elem, const std::vector<int64_t>& shape, const std::string& what,
                 const Tensor& ref) {
  require_elem(t, elem, "");
  require_same_where(t, ref);
  require_shape(t, shape, what);
  require_contiguous(t);
}

// Everything one attention call needs, checked; the Tensors keep the arrays alive for the call.
struct DecodeCall {
  dg::DecodeArgs args;
  Where where = Where::kHost;
  Tensor out, q, k, v, tables, lens, alibi, k_scale, v_scale, sinks;
};

// The attention variants of one eager call (issue 17): AttentionSpec's window and soft-cap, and
// the sinks array (float32 [num_q_heads] or None).
struct Variants {
  int sliding_window = 0;
  float logit_softcap = 0.0f;
  nb::handle sinks;
};

// q_len given as an argument (or None): 1..kMaxQLen.
void check_q_len_arg(int n) {
  if (n < 1 || n > dg::kMaxQLen)
    throw_invalid("q_len", n, "1..kMaxQLen = 1.." + std::to_string(dg::kMaxQLen) + " query tokens per sequence");
}

std::unique_ptr<DecodeCall> decode_call(nb::handle out, nb::handle q, nb::handle k_cache, nb::handle v_cache,
                                        nb::handle block_tables, nb::handle seq_lens, int max_seq_len,
                                        float scale, nb::handle alibi_slopes, nb::handle k_scale,
                                        nb::handle v_scale, const std::string& kv_cache_dtype, const Variants& var,
                                        std::optional<int> q_len) {
  auto c = std::make_unique<DecodeCall>();
  c->q = import_tensor(q, "q", false);
  c->out = import_tensor(out, "out", true);
  c->k = import_tensor(k_cache, "k_cache", false);
  c->v = import_tensor(v_cache, "v_cache", false);
  c->tables = import_tensor(block_tables, "block_tables", false);
  c->lens = import_tensor(seq_lens, "seq_lens", false);

  const dg::DType dtype = dtype_of(c->q);
  const bool q4 = c->q.ndim() == 4;  // [num_seqs, q_len, num_q_heads, head_size]
  if (c->q.ndim() != 3 && !q4)
    throw_invalid("q.shape", c->q.shape_text(),
                  "[num_seqs, num_q_heads, head_size], or [num_seqs, q_len, num_q_heads, head_size] (q_len rows "
                  "per sequence)");
  // q_len: q's shape[1] when 4-D, else the argument (1 by default); both given must agree.
  if (q_len) check_q_len_arg(*q_len);
  if (q4) {
    if (c->q.shape[1] < 1 || c->q.shape[1] > dg::kMaxQLen)
      throw_invalid("q.shape[1]", c->q.shape[1],
                    "a q_len of 1..kMaxQLen = 1.." + std::to_string(dg::kMaxQLen) + " query tokens per sequence");
    if (q_len && *q_len != c->q.shape[1])
      throw_invalid("q_len", *q_len, "None or q.shape[1] = " + std::to_string(c->q.shape[1]) + " (q is 4-D)");
  }
  const int n_rows = q4 ? static_cast<int>(c->q.shape[1]) : q_len.value_or(1);
  // Heads and head size from q; KV heads, block size and layout from k_cache, whose shape is then
  // checked against them (so a malformed cache is the argument named).
  dg::AttentionSpec s = spec_from_cache(c->k, dtype, static_cast<int>(c->q.shape[q4 ? 2 : 1]),
                                        static_cast<int>(c->q.shape[q4 ? 3 : 2]));
  s.scale = scale;
  s.kv_dtype = kv_of(c->k, kv_cache_dtype);
  s.sliding_window = var.sliding_window;
  s.logit_softcap = var.logit_softcap;
  validate_inferred(s, c->q, c->k);
  import_scales(k_scale, v_scale, s, c->q, c->k_scale, c->v_scale);
  c->where = c->q.where;
  if (c->where == Where::kCuda) require_where(c->q, Where::kCuda, current_cuda_device(), " (the current device)");
  check_caches(c->k, c->v, s, c->q);
  const RowArray qr = require_rows(c->q, s.num_q_heads, s.head_size, n_rows > 1 ? "num_seqs x q_len" : "num_seqs", true);
  if (qr.rows % n_rows != 0)
    throw_invalid("q.shape[0]", qr.rows,
                  "num_seqs x q_len rows, a multiple of q_len = " + std::to_string(n_rows) + " (row s * q_len + j is token j of sequence s)");
  const int64_t n = qr.rows / n_rows;  // sequences
  require_elem(c->out, elem_of(dtype), ", as q");
  require_same_where(c->out, c->q);
  const RowArray orow = require_rows(c->out, s.num_q_heads, s.head_size, n_rows > 1 ? "num_seqs x q_len" : "num_seqs", true);
  if (orow.per_seq != 0 && (c->out.shape[0] != n || orow.per_seq != n_rows))
    throw_invalid("out.shape", c->out.shape_text(),
                  "[num_seqs, q_len, ...] = [" + std::to_string(n) + ", " + std::to_string(n_rows) + ", ...], as q");
  if (orow.rows != qr.rows)
    throw_invalid("out.shape[0]", orow.rows,
                  n_rows > 1 ? "num_seqs x q_len = " + std::to_string(n) + " x " + std::to_string(n_rows) + " = " +
                                   std::to_string(qr.rows) + " rows, as q"
                             : "num_seqs = " + std::to_string(n) + " (q.shape[0])");
  check_index(c->tables, Elem::kInt32, {n, -1}, "[num_seqs, max_blocks_per_seq] with num_seqs = " + std::to_string(n), c->q);
  check_index(c->lens, Elem::kInt32, {n}, "[num_seqs] with num_seqs = " + std::to_string(n), c->q);

  dg::DecodeArgs& a = c->args;
  a.spec = s;
  a.num_seqs = static_cast<int>(n);
  a.q_len = n_rows;
  a.block_table_stride = static_cast<int>(c->tables.shape[1]);
  a.max_seq_len = max_seq_len > 0 ? max_seq_len : a.block_table_stride * s.block_size;
  a.num_blocks = static_cast<int>(c->k.shape[0]);
  a.q_stride = qr.row_stride;
  a.out_stride = orow.row_stride;
  a.q = c->q.data;
  a.out = c->out.data;
  a.k_cache = c->k.data;
  a.v_cache = c->v.data;
  a.block_tables = static_cast<const int32_t*>(c->tables.data);
  a.seq_lens = static_cast<const int32_t*>(c->lens.data);
  if (s.fp8_kv()) {
    a.k_scale = static_cast<const float*>(c->k_scale.data);
    a.v_scale = static_cast<const float*>(c->v_scale.data);
  }
  if (!alibi_slopes.is_none()) {
    c->alibi = import_tensor(alibi_slopes, "alibi_slopes", false);
    check_index(c->alibi, Elem::kFp32, {s.num_q_heads}, "[num_q_heads] = [" + std::to_string(s.num_q_heads) + "]", c->q);
    a.alibi_slopes = static_cast<const float*>(c->alibi.data);
  }
  if (!var.sinks.is_none()) {
    c->sinks = import_tensor(var.sinks, "sinks", false);
    check_index(c->sinks, Elem::kFp32, {s.num_q_heads}, "[num_q_heads] = [" + std::to_string(s.num_q_heads) + "]", c->q);
    a.sinks = static_cast<const float*>(c->sinks.data);
  }
  if (c->where == Where::kHost) {  // the host implementation checks every length and block id
    a.host_seq_lens = a.seq_lens;
    a.host_block_tables = a.block_tables;
  }
  return c;
}

nb::object paged_attention_v1(nb::handle out, nb::handle q, nb::handle k_cache, nb::handle v_cache,
                              nb::handle block_tables, nb::handle seq_lens, int max_seq_len, float scale,
                              nb::handle alibi_slopes, nb::handle k_scale, nb::handle v_scale,
                              const std::string& kv_cache_dtype, int sliding_window, float logit_softcap,
                              nb::handle sinks, std::optional<int> q_len, nb::handle stream) {
  auto c = decode_call(out, q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale, alibi_slopes, k_scale,
                       v_scale, kv_cache_dtype, Variants{sliding_window, logit_softcap, sinks}, q_len);
  const dg::Stream s = stream_from_py(stream);
  {
    nb::gil_scoped_release nogil;
    if (c->where == Where::kHost) dg::host::paged_attention_v1(c->args);
    else dg::paged_attention_v1(c->args, s);
  }
  return nb::borrow(out);
}

nb::object paged_attention_v2(nb::handle out, nb::handle q, nb::handle k_cache, nb::handle v_cache,
                              nb::handle block_tables, nb::handle seq_lens, int partition_size,
                              nb::handle workspace, int max_seq_len, float scale, nb::handle alibi_slopes,
                              nb::handle k_scale, nb::handle v_scale, const std::string& kv_cache_dtype,
                              int sliding_window, float logit_softcap, nb::handle sinks, std::optional<int> q_len,
                              nb::handle stream) {
  auto c = decode_call(out, q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale, alibi_slopes, k_scale,
                       v_scale, kv_cache_dtype, Variants{sliding_window, logit_softcap, sinks}, q_len);
  const dg::DecodeArgs& a = c->args;
  dg::validate_partition_size(a.spec, partition_size);
  const std::size_t need = dg::v2_workspace_size(a.spec, a.num_seqs, a.max_seq_len, partition_size, a.q_len);
  const dg::Stream s = stream_from_py(stream);
  Tensor ws;
  std::unique_ptr<void, decltype(&std::free)> own(nullptr, &std::free);
  void* ws_ptr = nullptr;
  std::size_t ws_bytes = need;
  if (workspace.is_none()) {
    if (c->where != Where::kHost)
      throw_invalid("workspace", "None", "a uint8 CUDA array of at least " + std::to_string(need) +
                                             " bytes (v2_workspace_size) for CUDA arrays");
    own.reset(std::aligned_alloc(256, (need + 255) / 256 * 256));
    if (!own) throw dg::OutOfMemory("paged_attention_v2: host workspace of " + std::to_string(need) + " bytes");
    ws_ptr = own.get();
  } else {
    ws = import_tensor(workspace, "workspace", true);
    require_elem(ws, Elem::kUInt8, "");
    require_same_where(ws, c->q);
    require_contiguous(ws);
    if (ws.nbytes() < need)
      throw_invalid("workspace.nbytes", ws.nbytes(), "at least v2_workspace_size(...) = " + std::to_string(need));
    ws_ptr = ws.data;
    ws_bytes = ws.nbytes();
  }
  {
    nb::gil_scoped_release nogil;
    if (c->where == Where::kHost) dg::host::paged_attention_v2(a, partition_size, ws_ptr, ws_bytes);
    else dg::paged_attention_v2(a, partition_size, ws_ptr, ws_bytes, s);
  }
  return nb::borrow(out);
}

void append_kv(nb::handle key, nb::handle value, nb::handle k_cache, nb::handle v_cache, nb::handle slot_mapping,
               nb::handle k_scale, nb::handle v_scale, const std::string& kv_cache_dtype, nb::handle stream) {
  Tensor kt = import_tensor(key, "key", false);
  Tensor vt = import_tensor(value, "value", false);
  Tensor kc = import_tensor(k_cache, "k_cache", true);
  Tensor vc = import_tensor(v_cache, "v_cache", true);
  Tensor sm = import_tensor(slot_mapping, "slot_mapping", false);
  const dg::KVCacheDType kv = kv_of(kc, kv_cache_dtype);
  // The model dtype: the cache's for kv_dtype auto, key's for fp8 caches (which quantise).
  const dg::DType dtype = kv == dg::KVCacheDType::kAuto ? dtype_of(kc) : dtype_of(kt);
  dg::AttentionSpec s = spec_from_cache(kc, dtype, 0, 0);
  s.kv_dtype = kv;
  validate_inferred(s, kt, kc);
  Tensor ks, vs;
  import_scales(k_scale, v_scale, s, kc, ks, vs);
  if (kc.where == Where::kCuda) require_where(kc, Where::kCuda, current_cuda_device(), " (the current device)");
  check_caches(kc, vc, s, kc);
  for (Tensor* t : {&kt, &vt}) {
    require_elem(*t, elem_of(dtype), kv == dg::KVCacheDType::kAuto ? ", as k_cache" : " (the model dtype)");
    require_same_where(*t, kc);
  }
  // [num_tokens, ...] rows, or [num_seqs, q_len, ...] (a speculative step's tokens, flattened as
  // row s * q_len + j) with slot_mapping [num_seqs, q_len].
  const RowArray kr = require_rows(kt, s.num_kv_heads, s.head_size, "num_tokens", true);
  const RowArray vr = require_rows(vt, s.num_kv_heads, s.head_size, "num_tokens", true);
  if (vr.rows != kr.rows)
    throw_invalid(vr.per_seq ? "value.shape" : "value.shape[0]", vr.per_seq ? vt.shape_text() : std::to_string(vr.rows),
                  "num_tokens = " + std::to_string(kr.rows) + " rows, as key " + kt.shape_text());
  if (kr.per_seq && vr.per_seq && vt.shape[0] != kt.shape[0])
    throw_invalid("value.shape", vt.shape_text(), "key's shape " + kt.shape_text());
  require_elem(sm, Elem::kInt64, "");
  require_same_where(sm, kc);
  const std::string tokens = std::to_string(kr.rows);
  if (kr.per_seq) {  // key [num_seqs, q_len, ...]: slots [num_seqs, q_len]
    require_shape(sm, {kt.shape[0], kt.shape[1]},
                  "[num_seqs, q_len] = [" + std::to_string(kt.shape[0]) + ", " + std::to_string(kt.shape[1]) +
                      "] (key.shape[:2])");
  } else if (sm.ndim() == 2) {
    if (sm.shape[0] * sm.shape[1] != kr.rows)
      throw_invalid("slot_mapping.shape", sm.shape_text(),
                    "[num_tokens] or [num_seqs, q_len] with num_seqs x q_len = num_tokens = " + tokens + " (key.shape[0])");
  } else {
    require_shape(sm, {kr.rows}, "[num_tokens] or [num_seqs, q_len] with num_tokens = " + tokens + " (key.shape[0])");
  }
  require_contiguous(sm);

  dg::AppendArgs a;
  a.spec = s;
  a.num_tokens = static_cast<int>(kr.rows);
  a.num_blocks = static_cast<int>(kc.shape[0]);
  a.key_stride = kr.row_stride;
  a.value_stride = vr.row_stride;
  a.key = kt.data;
  a.value = vt.data;
  a.k_cache = kc.data;
  a.v_cache = vc.data;
  a.slot_mapping = static_cast<const int64_t*>(sm.data);
  if (s.fp8_kv()) {
    a.k_scale = static_cast<const float*>(ks.data);
    a.v_scale = static_cast<const float*>(vs.data);
  }
  if (kc.where == Where::kHost) a.host_slot_mapping = a.slot_mapping;
  const dg::Stream st = stream_from_py(stream);
  nb::gil_scoped_release nogil;
  if (kc.where == Where::kHost) dg::host::append_kv(a);
  else dg::append_kv(a, st);
}

}  // namespace

void bind_eager(nb::module_& m) {
  using namespace nb::literals;
  // .none(): None reaches import_tensor, which names the argument, instead of nanobind's TypeError.
  m.def("paged_attention_v1", &paged_attention_v1, "out"_a.none(), "q"_a.none(), "k_cache"_a.none(),
        "v_cache"_a.none(), "block_tables"_a.none(), "seq_lens"_a.none(), nb::kw_only(), "max_seq_len"_a = 0,
        "scale"_a = 0.0f, "alibi_slopes"_a.none() = nb::none(), "k_scale"_a.none() = nb::none(),
        "v_scale"_a.none() = nb::none(), "kv_cache_dtype"_a = "auto", "sliding_window"_a = 0,
        "logit_softcap"_a = 0.0f, "sinks"_a.none() = nb::none(), "q_len"_a.none() = nb::none(),
        "stream"_a.none() = nb::none());
  m.def("paged_attention_v2", &paged_attention_v2, "out"_a.none(), "q"_a.none(), "k_cache"_a.none(),
        "v_cache"_a.none(), "block_tables"_a.none(), "seq_lens"_a.none(), nb::kw_only(), "partition_size"_a,
        "workspace"_a.none() = nb::none(), "max_seq_len"_a = 0, "scale"_a = 0.0f,
        "alibi_slopes"_a.none() = nb::none(), "k_scale"_a.none() = nb::none(), "v_scale"_a.none() = nb::none(),
        "kv_cache_dtype"_a = "auto", "sliding_window"_a = 0, "logit_softcap"_a = 0.0f,
        "sinks"_a.none() = nb::none(), "q_len"_a.none() = nb::none(), "stream"_a.none() = nb::none());
  m.def("append_kv", &append_kv, "key"_a.none(), "value"_a.none(), "k_cache"_a.none(), "v_cache"_a.none(),
        "slot_mapping"_a.none(), nb::kw_only(), "k_scale"_a.none() = nb::none(), "v_scale"_a.none() = nb::none(),
        "kv_cache_dtype"_a = "auto", "stream"_a.none() = nb::none());
  m.def(
      "v2_workspace_size",
      [](nb::handle spec, int num_seqs, int max_seq_len, int partition_size, int q_len) {
        check_q_len_arg(q_len);
        return dg::v2_workspace_size(spec_from_py(spec), num_seqs, max_seq_len, partition_size, q_len);
      },
      "spec"_a, "num_seqs"_a, "max_seq_len"_a, "partition_size"_a, "q_len"_a = 1);
}

}  // namespace dgpy
