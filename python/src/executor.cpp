// decodegraph._core.Executor and StepContext: the C++ Executor behind a Python object.
//
// Lifetimes (docs/python.md, "Keep-alive rules"):
//  - The executor holds every array it was given (caches, q/out/new K/V) until it is destroyed or
//    rebind_layers() replaces them: their addresses are fixed into the graphs.
//  - A view (query(l), output(l), new_key(l), new_value(l), host_staging()) holds the executor's
//    memory (Core below: the C++ executor and the arrays it was given), not the Python object: the
//    memory it shows lives as long as the view. A view cannot keep the step body alive: views are
//    numpy arrays, which Python's cycle collector does not see through, so a view at module level
//    that held the Python executor (and so its body, the body's globals, and the view) was a cycle
//    nothing could free ("nanobind: leaked 1 instances" at exit). Now the Python executor is
//    collected as usual and drops the body then; views keep only memory.
//  - The step body and the host callbacks it enqueued are held by the executor. They take part in
//    Python's cycle collection (tp_traverse below), so a body that refers back to its executor is
//    collected with it.
// Threads: every call that runs library code releases the GIL and takes the executor's lock, so calls
// from several threads are serialised, and a host callback (which takes the GIL back) cannot deadlock
// against them. step(), rebind_layers(), capture_all() and check_errors() called from inside the
// executor's own step body or host callback are refused.
// step() is on every engine's hot path: host inputs come in through the buffer protocol (HostInput:
// no DLPack import, no allocation), messages are built only when a check fails, and the result is a
// StepResult made without running its __init__ (convert.cpp). docs/python.md quotes what it costs
// over the C++ step (bench/python_step.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "convert.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/executor.hpp"
#include "tensor.hpp"

namespace dgpy {
namespace {

using dg::throw_invalid;

// A Python callable held by C++ (the step body, a host callback). C++ may drop it without the GIL
// (a graph released inside step()), so the reference is released under the GIL.
struct PyCallable {
  nb::object fn;
  explicit PyCallable(nb::object f) : fn(std::move(f)) {}
  ~PyCallable() {
    if (fn.is_valid()) {
      nb::gil_scoped_acquire gil;
      fn.reset();
    }
  }
};

// One layer's arrays, as given: the Tensors keep them alive, the objects are what query(l) & co.
// return for caller-owned buffers.
struct LayerKeep {
  Tensor k_cache, v_cache;
  std::optional<Tensor> k_scale, v_scale;  // fp8 caches
  std::optional<Tensor> sinks;             // attention sinks
  std::optional<Tensor> q, out, new_key, new_value;
  nb::object q_obj, out_obj, new_key_obj, new_value_obj;
};

// What a view keeps alive: the C++ executor (its buffers) and the arrays it was given. Shared by the
// Python executor and every view (a capsule owning a shared_ptr); the last of them frees it, with the
// GIL held (capsules are freed by Python). `ex` is declared last so it goes first: on CUDA its
// destructor waits for the last step, which may still read the given arrays.
struct Core {
  std::vector<LayerKeep> layers;
  std::unique_ptr<dg::Executor> ex;
};

// The owner a view hands to DLPack / numpy: a capsule holding a reference to the Core.
nb::object core_owner(const std::shared_ptr<Core>& core) {
  return nb::capsule(new std::shared_ptr<Core>(core),
                     [](void* p) noexcept { delete static_cast<std::shared_ptr<Core>*>(p); });
}

// A step input through the buffer protocol (numpy, memoryview, array.array: host memory), read
// without nanobind's DLPack import: step()'s fast path. Anything else, or anything a check below
// does not accept, goes through import_tensor and its checks, which name what is wrong.
struct HostInput {
  Py_buffer view{};
  bool held = false;
  HostInput() = default;
  HostInput(const HostInput&) = delete;
  HostInput& operator=(const HostInput&) = delete;
  ~HostInput() {
    if (held) PyBuffer_Release(&view);
  }
  bool get(nb::handle obj) {
    if (!PyObject_CheckBuffer(obj.ptr())) return false;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
      PyErr_Clear();  // e.g. numpy refuses to export an ml_dtypes array: the general path says why
      return false;
    }
    held = true;
    return true;
  }
  // A native-order signed integer of `bytes` bytes ("i", "l", "q", "<i", ...: the size is the
  // buffer's itemsize, whatever the letter).
  bool is_int(Py_ssize_t bytes) const {
    const char* f = view.format;
    if (f == nullptr || view.itemsize != bytes) return false;
    if (*f == '@' || *f == '=' || (*f == '<' && std::endian::native == std::endian::little)) ++f;
    return (f[0] == 'i' || f[0] == 'l' || f[0] == 'q') && f[1] == '\0';
  }
  // Row-major and dense (extent-1 dimensions' strides ignored).
  bool contiguous() const {
    Py_ssize_t acc = view.itemsize;
    for (int i = view.ndim - 1; i >= 0; --i) {
      if (view.shape[i] != 1 && view.strides[i] != acc) return false;
      acc *= view.shape[i];
    }
    return true;
  }
};

class PyExecutor;

class PyStepContext {
 public:
  PyStepContext(dg::StepContext* ctx, PyExecutor* owner) : ctx_(ctx), owner_(owner) {}
  dg::StepContext& get() const {
    if (!ctx_)
      throw dg::Error("StepContext: used after the step body returned; it is valid only inside the body");
    return *ctx_;
  }
  void invalidate() { ctx_ = nullptr; }
  PyExecutor* owner() const { return owner_; }

 private:
  dg::StepContext* ctx_;
  PyExecutor* owner_;
};

class PyExecutor {
 public:
  PyExecutor(nb::handle config, nb::handle body);
  ~PyExecutor() {
    // No step can run once the Python object is gone: drop the body and callbacks now (views may
    // keep the Core, and with it the C++ executor's closures, alive), with the GIL, which we hold.
    clear();
  }

  nb::object step(nb::handle seq_lens, nb::handle block_tables, nb::handle slot_mapping, nb::handle stream,
                  int max_seq_len, int q_len);
  void rebind_layers(nb::handle layers);
  void check_errors() {
    Busy b(*this, "check_errors");
    nb::gil_scoped_release nogil;
    ex_->check_errors();
  }
  void capture_all() {
    Busy b(*this, "capture_all");
    nb::gil_scoped_release nogil;
    ex_->capture_all();
  }

  std::vector<int64_t> time_cpp_steps(nb::handle seq_lens, nb::handle block_tables, nb::handle slot_mapping, int q_len,
                                      int iters);
  nb::object layer_view(int layer, int which, std::optional<int> q_len);
  nb::object host_staging(nb::handle make);

  nb::list plans(std::optional<int> group) {
    auto lk = lock();
    return group ? to_py(ex_->plans(*group)) : to_py(ex_->plans());
  }
  nb::dict plan_for(int bucket, int band, int group, std::optional<int> q_len) {
    auto lk = lock();
    return to_py(ex_->plan_for(group, dg::BucketIndex(bucket), band, q_len_or_first(q_len)));
  }
  /// config().q_lens, ascending (the library sorts them).
  std::vector<int> q_lens() const { return ex_->config().q_lens; }
  int num_layer_groups() const { return ex_->num_layer_groups(); }
  int layer_group(int layer) const { return ex_->layer_group(layer); }
  std::vector<int> group_layers(int group) const { return ex_->group_layers(group); }
  // plan_for(const StepResult&): the fields it reads, so that its error (band -1 chosen on the
  // device) is the C++ one; then group `group`'s plan of the same cell.
  nb::dict plan_for_step(int bucket, int band, bool band_on_device, int graph_id, int group, int q_len) {
    auto lk = lock();
    dg::StepResult r;
    r.bucket = dg::BucketIndex(bucket);
    r.band = band;
    r.band_on_device = band_on_device;
    r.graph_id = graph_id;
    r.q_len = q_len;
    const dg::BucketPlan& p0 = ex_->plan_for(r);
    return to_py(group == 0 ? p0 : ex_->plan_for(group, r.bucket, r.band, r.q_len));
  }
  nb::list plans_for(int bucket, int group, std::optional<int> q_len) {
    auto lk = lock();
    return to_py(ex_->plans_for(group, dg::BucketIndex(bucket), q_len_or_first(q_len)));
  }
  nb::dict plan_for_batch(int batch, int band, std::optional<int> q_len) {
    auto lk = lock();
    return to_py(ex_->plan_for_batch(batch, band, q_len_or_first(q_len)));
  }
  std::string plan_table() {
    auto lk = lock();
    return ex_->plan_table();
  }
  nb::dict stats() {
    auto lk = lock();
    dg::ExecutorStats s;
    {
      nb::gil_scoped_release nogil;  // CUDA: waits for the last step
      s = ex_->stats();
    }
    // The steps this binding refused before the C++ step saw them (an array's dtype, shape or
    // device, q_len, a missing slot_mapping): rejected steps like the library's own.
    s.rejected_steps += binding_rejected_.load();
    return to_py(s);
  }
  nb::dict memory() {
    auto lk = lock();
    return to_py(ex_->memory());
  }
  dg::BackendKind backend() const { return ex_->backend(); }
  dg::BandSelect band_select() const { return ex_->band_select(); }
  uintptr_t stream() const { return reinterpret_cast<uintptr_t>(ex_->stream()); }
  int num_layers() const { return static_cast<int>(layers_.size()); }

  // GC support: the Python objects this executor holds that may refer back to it (the callables;
  // the cached host-staging objects, for completeness).
  int traverse(visitproc visit, void* arg) {
    if (body_ && body_->fn.is_valid()) Py_VISIT(body_->fn.ptr());
    for (const auto& cb : callbacks_)
      if (cb->fn.is_valid()) Py_VISIT(cb->fn.ptr());
    for (const auto& st : staging_)
      if (st.second.is_valid()) Py_VISIT(st.second.ptr());
    return 0;
  }
  void clear() {
    if (body_) body_->fn.reset();
    for (const auto& cb : callbacks_) cb->fn.reset();
    staging_.clear();
  }

  // StepContext::enqueue_host for a Python callable.
  void enqueue_host(dg::StepContext& ctx, nb::object fn) {
    auto cb = std::make_shared<PyCallable>(std::move(fn));
    // Drop callbacks no graph holds any more (re-captured by rebind_layers, say).
    std::erase_if(callbacks_, [](const std::shared_ptr<PyCallable>& c) { return c.use_count() == 1; });
    callbacks_.push_back(cb);
    ctx.enqueue_host([cb] {
      nb::gil_scoped_acquire gil;
      if (cb->fn.is_valid()) cb->fn();
    });
  }

  const dg::AttentionSpec& spec() const { return spec_; }
  /// Layer l's spec (config.layer_specs, else spec); spec past the configured layers, whose count
  /// the library checks.
  const dg::AttentionSpec& spec_of(std::size_t l) const { return l < layer_specs_.size() ? layer_specs_[l] : spec_; }

 private:
  // Serialises calls; the GIL is released while waiting, so a host callback holding the lock can
  // take the GIL back.
  std::unique_lock<std::recursive_mutex> lock() {
    std::unique_lock<std::recursive_mutex> lk(mu_, std::try_to_lock);
    if (!lk.owns_lock()) {
      nb::gil_scoped_release nogil;
      lk.lock();
    }
    return lk;
  }
  // A call that runs steps or captures: refused from inside this executor's own body or callbacks.
  struct Busy {
    PyExecutor& e;
    std::unique_lock<std::recursive_mutex> lk;
    Busy(PyExecutor& ex, const char* what) : e(ex), lk(ex.lock()) {
      if (e.busy_) {
        throw dg::Error(std::string(what) + "() called from inside this executor's step body or host callback "
                        "(while it runs a step or a capture); call it after the step returns");
      }
      e.busy_ = true;
    }
    ~Busy() { e.busy_ = false; }
  };

  dg::StepBody make_body();
  // None: config().q_lens[0], the smallest (the library's default).
  int q_len_or_first(std::optional<int> q_len) const { return q_len ? *q_len : ex_->config().q_lens.front(); }
  // A q_len argument of step() or a view: one of config().q_lens.
  void require_q_len(int q_len) const {
    const std::vector<int>& q = ex_->config().q_lens;
    if (std::find(q.begin(), q.end(), q_len) != q.end()) return;
    std::string list = "[";
    for (std::size_t i = 0; i < q.size(); ++i) list += (i ? ", " : "") + std::to_string(q[i]);
    throw_invalid("q_len", q_len,
                  "one of q_lens = " + list + "] (ExecutorConfig.q_lens, the q_lens graphs are captured for; each 1.." +
                      std::to_string(dg::kMaxQLen) + ")");
  }
  std::vector<dg::LayerBuffers> import_layers(nb::handle layers, std::vector<LayerKeep>& keep);

  nb::object step_impl(nb::handle seq_lens, nb::handle block_tables, nb::handle slot_mapping, nb::handle stream,
                       int max_seq_len, int q_len, bool& ran);
  bool fast_inputs(dg::StepInputs& in, const HostInput& lens, const HostInput& tables, const HostInput* slots,
                   int q_len) const;

  std::shared_ptr<Core> core_ = std::make_shared<Core>();
  std::unique_ptr<dg::Executor>& ex_ = core_->ex;  // the Core's executor, under its old name
  dg::AttentionSpec spec_;
  std::vector<dg::AttentionSpec> layer_specs_;  // config.layer_specs: empty, or one per layer
  int max_batch_ = 0;
  int max_q_len_ = 1;  // the largest of config.q_lens: layer buffers hold max_batch x max_q_len_ rows
  int num_blocks_ = 0;
  Where where_ = Where::kHost;
  int device_id_ = 0;
  std::vector<LayerKeep>& layers_ = core_->layers;
  bool append_kv_ = true;  // config.append_kv: step() needs a slot_mapping
  std::optional<StepResultType> result_type_;  // decodegraph.StepResult, looked up once
  std::atomic<long long> binding_rejected_{0};  // steps refused here, before the C++ step (stats())
  // host_staging(): one Python object per set of pinned buffers (the C++ ring hands out at most
  // three), made on first use and reused: its views stay valid as long as the executor's memory.
  std::vector<std::pair<const void*, nb::object>> staging_;
  std::shared_ptr<PyCallable> body_;
  std::vector<std::shared_ptr<PyCallable>> callbacks_;
  std::recursive_mutex mu_;
  bool busy_ = false;
};

std::string backend_why(Where w) {
  return w == Where::kHost ? " (the host backend)" : " (the CUDA backend)";
}

PyExecutor::PyExecutor(nb::handle config, nb::handle body) {
  dg::ExecutorConfig cfg = config_from_py(config);
  spec_ = cfg.spec;
  dg::validate_spec(spec_);
  dg::validate_layer_specs(cfg);  // before the arrays are checked against each layer's spec
  layer_specs_ = cfg.layer_specs;
  max_batch_ = cfg.max_batch;
  append_kv_ = cfg.append_kv;
  result_type_.emplace(nb::module_::import_("decodegraph._types").attr("StepResult"));
  // Bad q_lens are the library's to reject (after this); only valid ones size the row checks.
  for (int q : cfg.q_lens)
    if (q >= 1 && q <= dg::kMaxQLen) max_q_len_ = std::max(max_q_len_, q);
  dg::BackendKind kind = cfg.backend;
  if (kind == dg::BackendKind::kAuto)
    kind = dg::cuda_device_available() ? dg::BackendKind::kCuda : dg::BackendKind::kHost;
  if (kind == dg::BackendKind::kCuda) {
    // The library's own check, made before the arrays are checked against the backend.
    dg::require(dg::cuda_device_available(), "backend", "cuda",
                DECODEGRAPH_HAS_CUDA ? "host or auto (no usable CUDA device is present)"
                                     : "host or auto (this build has no CUDA)");
    where_ = Where::kCuda;
    device_id_ = current_cuda_device();
  }
  nb::object layers = config.attr("layers");
  if (cfg.num_blocks == 0 && nb::len(layers) > 0) {
    // num_blocks defaults to what the first layer's K cache holds.
    Tensor k0 = import_tensor(layers[0].attr("k_cache"), "layers[0].k_cache", true);
    if (k0.ndim() > 0) cfg.num_blocks = static_cast<int>(k0.shape[0]);
  }
  num_blocks_ = cfg.num_blocks;
  std::vector<LayerKeep> keep;
  cfg.layers = import_layers(layers, keep);
  if (!body.is_none()) body_ = std::make_shared<PyCallable>(nb::borrow(body));
  dg::StepBody step_body = body_ ? make_body() : dg::StepBody{};
  {
    nb::gil_scoped_release nogil;
    ex_ = std::make_unique<dg::Executor>(std::move(cfg), std::move(step_body));
  }
  layers_ = std::move(keep);
}

dg::StepBody PyExecutor::make_body() {
  std::shared_ptr<PyCallable> body = body_;
  return [this, body](dg::StepContext& ctx) {
    nb::gil_scoped_acquire gil;
    if (!body->fn.is_valid()) return;
    auto* py_ctx = new PyStepContext(&ctx, this);
    nb::object obj = nb::cast(py_ctx, nb::rv_policy::take_ownership);
    struct Invalidate {
      PyStepContext* c;
      ~Invalidate() { c->invalidate(); }
    } guard{py_ctx};
    body->fn(obj);
  };
}

std::vector<dg::LayerBuffers> PyExecutor::import_layers(nb::handle layers, std::vector<LayerKeep>& keep) {
  const std::string why = backend_why(where_);
  const std::string dtype_why = " (spec.dtype)";
  std::vector<dg::LayerBuffers> out;
  const std::size_t n = nb::len(layers);
  keep.resize(n);
  for (std::size_t l = 0; l < n; ++l) {
    nb::object layer = layers[l];
    const std::string pre = "layers[" + std::to_string(l) + "].";
    const dg::AttentionSpec& s = spec_of(l);  // each layer's arrays have its own spec's shapes
    LayerKeep& k = keep[l];
    dg::LayerBuffers lb;
    k.k_cache = import_tensor(layer.attr("k_cache"), pre + "k_cache", true);
    k.v_cache = import_tensor(layer.attr("v_cache"), pre + "v_cache", true);
    for (Tensor* t : {&k.k_cache, &k.v_cache}) {
      const bool key = t == &k.k_cache;
      require_cache_elem(*t, s, s.fp8_kv() ? " (spec.kv_cache_dtype)" : dtype_why);
      require_where(*t, where_, device_id_, why);
      auto shape = cache_shape(s, -1, key);
      require_shape(*t, shape, cache_shape_text(s, key));
      require_contiguous(*t);
      if (t->shape[0] < num_blocks_)
        throw_invalid(t->name + ".shape[0]", t->shape[0], "at least num_blocks = " + std::to_string(num_blocks_));
    }
    lb.k_cache = k.k_cache.data;
    lb.v_cache = k.v_cache.data;
    lb.k_cache_bytes = k.k_cache.nbytes();
    lb.v_cache_bytes = k.v_cache.nbytes();
    // fp8 caches: float32 [spec.kv_scale_count] scales the graphs read at every replay; the library
    // checks their values (host backend: at construction and before every step).
    if (s.fp8_kv()) {
      const std::string shape_words = "float32 [" + std::to_string(s.kv_scale_count()) + "] (spec.kv_scale_count: " +
                                      (s.kv_scale_per_head ? "one per KV head" : "one for the layer") + ")";
      for (auto [field, slot, ptr] : {std::tuple{"k_scale", &k.k_scale, &lb.k_scale},
                                      std::tuple{"v_scale", &k.v_scale, &lb.v_scale}}) {
        nb::object o = layer.attr(field);
        if (o.is_none())
          throw_invalid(pre + field, "None",
                        shape_words + ", required with kv_cache_dtype " + dg::to_string(s.kv_dtype));
        Tensor t = import_tensor(o, pre + field, false);
        require_elem(t, Elem::kFp32, "");
        require_where(t, where_, device_id_, why);
        require_shape(t, {s.kv_scale_count()}, shape_words);
        require_contiguous(t);
        *ptr = static_cast<const float*>(t.data);
        *slot = std::move(t);
      }
    }

    // Attention sinks: float32 [num_q_heads], read at every replay.
    if (nb::object o = layer.attr("sinks"); !o.is_none()) {
      Tensor t = import_tensor(o, pre + "sinks", false);
      require_elem(t, Elem::kFp32, "");
      require_where(t, where_, device_id_, why);
      require_shape(t, {s.num_q_heads}, "float32 [" + std::to_string(s.num_q_heads) + "] (num_q_heads)");
      require_contiguous(t);
      lb.sinks = static_cast<const float*>(t.data);
      k.sinks = std::move(t);
    }

    // Optional row buffers: [rows >= max_batch x max(q_lens), heads, head_size] (or 2-D), rows may
    // be strided.
    const int64_t max_rows = int64_t{max_batch_} * max_q_len_;
    const std::string rows_words = max_q_len_ == 1 ? "max_batch" : "max_batch x max(q_lens)";
    auto rows = [&](const char* field, bool writable, int heads, std::optional<Tensor>& slot, nb::object& obj,
                    void*& ptr, int64_t& stride) {
      nb::object o = layer.attr(field);
      if (o.is_none()) return;
      Tensor t = import_tensor(o, pre + field, writable);
      require_elem(t, elem_of(s.dtype), dtype_why);
      require_where(t, where_, device_id_, why);
      const RowArray r = require_rows(t, heads, s.head_size, rows_words);
      if (r.rows < max_rows)
        throw_invalid(t.name + ".shape[0]", r.rows,
                      max_q_len_ == 1 ? "at least max_batch = " + std::to_string(max_batch_)
                                      : "at least max_batch x max(q_lens) = " + std::to_string(max_batch_) + " x " +
                                            std::to_string(max_q_len_) + " = " + std::to_string(max_rows) +
                                            " rows (a step of q_len n uses rows [num_seqs, n])");
      ptr = t.data;
      stride = r.row_stride;
      obj = o;
      slot = std::move(t);
    };
    rows("q", false, s.num_q_heads, k.q, k.q_obj, lb.q, lb.q_stride);
    rows("out", true, s.num_q_heads, k.out, k.out_obj, lb.out, lb.out_stride);
    rows("new_key", false, s.num_kv_heads, k.new_key, k.new_key_obj, lb.new_key, lb.new_key_stride);
    rows("new_value", false, s.num_kv_heads, k.new_value, k.new_value_obj, lb.new_value, lb.new_value_stride);
    out.push_back(lb);
  }
  return out;
}

nb::object PyExecutor::step(nb::handle seq_lens, nb::handle block_tables, nb::handle slot_mapping,
                            nb::handle stream, int max_seq_len, int q_len) {
  bool ran = false;  // the C++ step was called: it counts its own rejections
  try {
    return step_impl(seq_lens, block_tables, slot_mapping, stream, max_seq_len, q_len, ran);
  } catch (...) {
    if (!ran) ++binding_rejected_;
    throw;
  }
}

// The fast path's checks: what the general path below checks, for buffer-protocol inputs. False
// (nothing thrown) sends the step through the general path, whose checks then name the problem.
bool PyExecutor::fast_inputs(dg::StepInputs& in, const HostInput& lens, const HostInput& tables,
                             const HostInput* slots, int q_len) const {
  const Py_buffer &l = lens.view, &t = tables.view;
  if (!lens.is_int(4) || l.ndim != 1 || !lens.contiguous()) return false;
  const Py_ssize_t n = l.shape[0];
  if (!tables.is_int(4) || t.ndim != 2 || t.shape[0] != n || !tables.contiguous()) return false;
  if (slots) {
    const Py_buffer& sm = slots->view;
    if (!slots->is_int(8) || !slots->contiguous()) return false;
    const bool flat = q_len == 1 && sm.ndim == 1 && sm.shape[0] == n;
    if (!flat && !(sm.ndim == 2 && sm.shape[0] == n && sm.shape[1] == q_len)) return false;
    in.slot_mapping = static_cast<const int64_t*>(sm.buf);
  }
  in.num_seqs = static_cast<int>(n);
  in.seq_lens = static_cast<const int32_t*>(l.buf);
  in.block_tables = static_cast<const int32_t*>(t.buf);
  in.block_table_stride = static_cast<int>(t.shape[1]);
  in.space = dg::MemorySpace::kHost;
  return true;
}

nb::object PyExecutor::step_impl(nb::handle seq_lens, nb::handle block_tables, nb::handle slot_mapping,
                                 nb::handle stream, int max_seq_len, int q_len, bool& ran) {
  require_q_len(q_len);  // first: the slot_mapping's shape depends on it
  dg::StepInputs in;
  // Fast path: host arrays through the buffer protocol, held until the step returns.
  HostInput fl, ft, fs;
  const bool has_slots = !slot_mapping.is_none();
  const bool fast = fl.get(seq_lens) && ft.get(block_tables) && (!has_slots || fs.get(slot_mapping)) &&
                    fast_inputs(in, fl, ft, has_slots ? &fs : nullptr, q_len);
  // General path: every array kind, every check with its message; the Tensors keep them alive
  // (constructed only here: the fast path builds no std::string, no std::vector).
  struct Imported {
    Tensor lens, tables;
    std::optional<Tensor> slots;
  };
  std::optional<Imported> general;
  if (!fast) {
    in = dg::StepInputs{};
    general.emplace();
    Tensor& lens = general->lens;
    Tensor& tables = general->tables;
    std::optional<Tensor>& slots = general->slots;
    lens = import_tensor(seq_lens, "seq_lens", false);
    require_elem(lens, Elem::kInt32, "");
    if (lens.ndim() != 1) throw_invalid("seq_lens.shape", lens.shape_text(), "[num_seqs]");
    require_contiguous(lens);
    const int64_t n = lens.shape[0];
    const std::string rows_words = " with num_seqs = " + std::to_string(n) + " (seq_lens.shape[0])";
    if (where_ == Where::kHost) require_where(lens, Where::kHost, 0, backend_why(where_));
    else if (lens.where == Where::kCuda) require_where(lens, Where::kCuda, device_id_, backend_why(where_));
    tables = import_tensor(block_tables, "block_tables", false);
    require_elem(tables, Elem::kInt32, "");
    require_same_where(tables, lens);
    require_shape(tables, {n, -1}, "[num_seqs, block_table_stride]" + rows_words);
    require_contiguous(tables);
    if (has_slots) {
      slots = import_tensor(slot_mapping, "slot_mapping", false);
      require_elem(*slots, Elem::kInt64, "");
      require_same_where(*slots, lens);
      // [num_seqs, q_len]; q_len 1 also [num_seqs], as before speculative steps.
      if (q_len == 1 && slots->ndim() == 1) {
        require_shape(*slots, {n}, "[num_seqs] or [num_seqs, 1]" + rows_words);
      } else {
        require_shape(*slots, {n, q_len},
                      "[num_seqs, q_len] = [" + std::to_string(n) + ", " + std::to_string(q_len) + "]" +
                          (q_len == 1 ? " or [num_seqs]" : "") + rows_words + ": one slot per new token");
      }
      require_contiguous(*slots);
    }
    in.num_seqs = static_cast<int>(n);
    in.seq_lens = static_cast<const int32_t*>(lens.data);
    in.block_tables = static_cast<const int32_t*>(tables.data);
    in.block_table_stride = static_cast<int>(tables.shape[1]);
    in.slot_mapping = slots ? static_cast<const int64_t*>(slots->data) : nullptr;
    in.space = lens.where == Where::kHost ? dg::MemorySpace::kHost : dg::MemorySpace::kDevice;
  }
  if (!has_slots && append_kv_)
    throw_invalid("slot_mapping", "None",
                  q_len == 1 ? std::string("int64 [num_seqs]: each new token's cache slot, required while append_kv "
                                           "is on (ExecutorConfig(append_kv=False) for attention-only steps)")
                             : "int64 [num_seqs, q_len] = [" + std::to_string(in.num_seqs) + ", " +
                                   std::to_string(q_len) + "]: each new token's cache slot, required while "
                                   "append_kv is on (ExecutorConfig(append_kv=False) for attention-only steps)");
  in.max_seq_len = max_seq_len;
  in.q_len = q_len;
  bool stream_given = false;
  const dg::Stream s = stream.is_none() ? nullptr : stream_from_py(stream, &stream_given);

  Busy b(*this, "step");
  dg::StepResult r;
  ran = true;
  {
    nb::gil_scoped_release nogil;
    r = stream_given ? ex_->step(in, s) : ex_->step(in);
  }
  return result_type_->make(r);
}

// bench/python_step.py's yardstick: the C++ Executor::step on the same executor and inputs, in a
// C++ loop, each call timed with steady_clock (what the Python step() adds is the difference).
// Host numpy inputs only; not part of the public API.
std::vector<int64_t> PyExecutor::time_cpp_steps(nb::handle seq_lens, nb::handle block_tables, nb::handle slot_mapping,
                                                int q_len, int iters) {
  require_q_len(q_len);
  HostInput fl, ft, fs;
  dg::StepInputs in;
  const bool has_slots = !slot_mapping.is_none();
  if (!(fl.get(seq_lens) && ft.get(block_tables) && (!has_slots || fs.get(slot_mapping)) &&
        fast_inputs(in, fl, ft, has_slots ? &fs : nullptr, q_len)))
    throw_invalid("time_cpp_steps inputs", "not contiguous int32 / int64 host arrays", "what step() takes fastest");
  in.q_len = q_len;
  Busy b(*this, "time_cpp_steps");
  std::vector<int64_t> ns(static_cast<std::size_t>(std::max(iters, 0)));
  nb::gil_scoped_release nogil;
  for (int64_t& t : ns) {
    const auto t0 = std::chrono::steady_clock::now();
    ex_->step(in);
    t = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
  return ns;
}

void PyExecutor::rebind_layers(nb::handle layers) {
  Busy b(*this, "rebind_layers");
  std::vector<LayerKeep> keep;
  std::vector<dg::LayerBuffers> lbs = import_layers(layers, keep);
  {
    nb::gil_scoped_release nogil;
    ex_->rebind_layers(std::move(lbs));
  }
  layers_ = std::move(keep);  // the old arrays are released only once no graph uses them
}

// which: 0 q, 1 out, 2 new_key, 3 new_value. q_len None: every row, [max_batch x max(q_lens), heads,
// head_size]; q_len n: the rows a step of n uses, [max_batch, n, heads, head_size] (row s * n + j).
nb::object PyExecutor::layer_view(int layer, int which, std::optional<int> q_len) {
  auto lk = lock();
  if (layer < 0 || layer >= num_layers())
    throw_invalid("layer", layer, "0 .. num_layers - 1 = 0 .. " + std::to_string(num_layers() - 1));
  if (q_len) require_q_len(*q_len);
  const LayerKeep& k = layers_[layer];
  const nb::object* given[] = {&k.q_obj, &k.out_obj, &k.new_key_obj, &k.new_value_obj};
  if (given[which]->is_valid()) return *given[which];  // a caller buffer: the caller's own array (Python shapes it)
  void* ptr = which == 0 ? ex_->query(layer) : which == 1 ? ex_->output(layer)
            : which == 2 ? ex_->new_key(layer) : ex_->new_value(layer);
  const dg::AttentionSpec& s = spec_of(static_cast<std::size_t>(layer));
  const std::size_t heads = which < 2 ? s.num_q_heads : s.num_kv_heads;
  const auto mb = static_cast<std::size_t>(max_batch_), hs = static_cast<std::size_t>(s.head_size);
  std::vector<std::size_t> shape = q_len ? std::vector<std::size_t>{mb, static_cast<std::size_t>(*q_len), heads, hs}
                                         : std::vector<std::size_t>{mb * static_cast<std::size_t>(max_q_len_), heads, hs};
  return export_view(ptr, shape, elem_of(s.dtype), where_, device_id_, core_owner(core_));
}

// The set of staging buffers the C++ executor hands out now, as the Python object `make` built from
// their views the first time this set was handed out: the same object every time after (the C++
// ring has at most three sets, at fixed addresses), so a call costs the C++ call and a lookup.
nb::object PyExecutor::host_staging(nb::handle make) {
  auto lk = lock();
  dg::HostStaging hs;
  {
    nb::gil_scoped_release nogil;  // CUDA: waits for the copies that last read this set
    hs = ex_->host_staging();
  }
  const void* key = hs.seq_lens.data();
  for (const auto& [k, obj] : staging_)
    if (k == key) return obj;
  nb::object owner = core_owner(core_);
  const auto rows = static_cast<std::size_t>(hs.seq_lens.size());
  const auto stride = static_cast<std::size_t>(hs.block_table_stride);
  nb::dict d;
  d["seq_lens"] = export_view(hs.seq_lens.data(), {rows}, Elem::kInt32, Where::kHost, 0, owner);
  d["block_tables"] = export_view(hs.block_tables.data(), {rows, stride}, Elem::kInt32, Where::kHost, 0, owner);
  // max_batch x max(q_lens) entries: a step of q_len n uses the first num_seqs x n ([num_seqs, n]).
  d["slot_mapping"] = export_view(hs.slot_mapping.data(), {hs.slot_mapping.size()}, Elem::kInt64, Where::kHost, 0, owner);
  d["block_table_stride"] = hs.block_table_stride;
  nb::object obj = make(d);
  staging_.emplace_back(key, obj);
  return obj;
}

int executor_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<PyExecutor>(self)->traverse(visit, arg);
}

int executor_clear(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<PyExecutor>(self)->clear();
  return 0;
}

PyType_Slot executor_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(executor_traverse)},
                                {Py_tp_clear, reinterpret_cast<void*>(executor_clear)},
                                {0, nullptr}};

}  // namespace

void bind_executor(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<PyExecutor>(m, "Executor", nb::type_slots(executor_slots), nb::is_weak_referenceable())
      .def(nb::init<nb::handle, nb::handle>(), "config"_a, "step_body"_a.none() = nb::none())
      // Positional after the arrays too: the Python wrapper passes everything by position (cheaper).
      .def("step", &PyExecutor::step, "seq_lens"_a.none(), "block_tables"_a.none(),
           "slot_mapping"_a.none() = nb::none(), "stream"_a.none() = nb::none(), "max_seq_len"_a = 0, "q_len"_a = 1)
      .def("rebind_layers", &PyExecutor::rebind_layers, "layers"_a)
      .def("check_errors", &PyExecutor::check_errors)
      .def("capture_all", &PyExecutor::capture_all)
      .def("query", [](PyExecutor& e, int l, std::optional<int> n) { return e.layer_view(l, 0, n); }, "layer"_a,
           "q_len"_a.none() = nb::none())
      .def("output", [](PyExecutor& e, int l, std::optional<int> n) { return e.layer_view(l, 1, n); }, "layer"_a,
           "q_len"_a.none() = nb::none())
      .def("new_key", [](PyExecutor& e, int l, std::optional<int> n) { return e.layer_view(l, 2, n); }, "layer"_a,
           "q_len"_a.none() = nb::none())
      .def("new_value", [](PyExecutor& e, int l, std::optional<int> n) { return e.layer_view(l, 3, n); }, "layer"_a,
           "q_len"_a.none() = nb::none())
      .def("host_staging", &PyExecutor::host_staging, "make"_a)
      .def("_time_cpp_steps", &PyExecutor::time_cpp_steps, "seq_lens"_a, "block_tables"_a, "slot_mapping"_a.none(),
           "q_len"_a, "iters"_a)
      .def("plans", &PyExecutor::plans, "group"_a.none() = nb::none())
      .def("plan_for", &PyExecutor::plan_for, "bucket"_a, "band"_a, "group"_a = 0, "q_len"_a.none() = nb::none())
      .def("layer_group", &PyExecutor::layer_group, "layer"_a)
      .def("group_layers", &PyExecutor::group_layers, "group"_a)
      .def("plan_for_step", &PyExecutor::plan_for_step, "bucket"_a, "band"_a, "band_on_device"_a, "graph_id"_a,
           "group"_a = 0, "q_len"_a = 1)
      .def("plans_for", &PyExecutor::plans_for, "bucket"_a, "group"_a = 0, "q_len"_a.none() = nb::none())
      .def("plan_for_batch", &PyExecutor::plan_for_batch, "batch_size"_a, "band"_a, "q_len"_a.none() = nb::none())
      .def("plan_table", &PyExecutor::plan_table)
      .def("stats", &PyExecutor::stats)
      .def("memory", &PyExecutor::memory)
      .def_prop_ro("backend", &PyExecutor::backend)
      .def_prop_ro("band_select", &PyExecutor::band_select)
      .def_prop_ro("stream", &PyExecutor::stream)
      .def_prop_ro("num_layers", &PyExecutor::num_layers)
      .def_prop_ro("q_lens", &PyExecutor::q_lens)
      .def_prop_ro("num_layer_groups", &PyExecutor::num_layer_groups);

  nb::class_<PyStepContext>(m, "StepContext")
      .def_prop_ro("stream", [](const PyStepContext& c) { return reinterpret_cast<uintptr_t>(c.get().stream()); })
      .def_prop_ro("backend", [](const PyStepContext& c) { return c.get().backend(); })
      .def_prop_ro("plan", [](const PyStepContext& c) { return to_py(c.get().plan()); })
      .def("append_kv", [](const PyStepContext& c, int layer) {
             dg::StepContext& ctx = c.get();
             nb::gil_scoped_release nogil;
             ctx.append_kv(layer);
           }, "layer"_a)
      .def("attention", [](const PyStepContext& c, int layer) {
             dg::StepContext& ctx = c.get();
             nb::gil_scoped_release nogil;
             ctx.attention(layer);
           }, "layer"_a)
      .def("enqueue_host", [](const PyStepContext& c, nb::object fn) {
             if (!PyCallable_Check(fn.ptr()))
               throw_invalid("fn", std::string("an object of type ") + Py_TYPE(fn.ptr())->tp_name, "a callable");
             c.owner()->enqueue_host(c.get(), std::move(fn));
           }, "fn"_a);
}

}  // namespace dgpy
