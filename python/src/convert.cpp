// Struct conversions (convert.hpp). Field names are the C++ names, which the dataclasses share.
#include "convert.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <iterator>

#include <structmember.h>

namespace dgpy {
namespace {

template <typename T>
T get(nb::handle o, const char* field) {
  return nb::cast<T>(o.attr(field));
}

}  // namespace

dg::AttentionSpec spec_from_py(nb::handle o) {
  dg::AttentionSpec s;
  s.num_q_heads = get<int>(o, "num_q_heads");
  s.num_kv_heads = get<int>(o, "num_kv_heads");
  s.head_size = get<int>(o, "head_size");
  s.block_size = get<int>(o, "block_size");
  s.dtype = get<dg::DType>(o, "dtype");
  s.layout = get<dg::KVLayout>(o, "layout");
  s.scale = get<float>(o, "scale");
  s.kv_dtype = get<dg::KVCacheDType>(o, "kv_cache_dtype");  // vLLM's name (AttentionSpec.kv_dtype is an alias)
  s.kv_scale_per_head = get<bool>(o, "kv_scale_per_head");
  s.sliding_window = get<int>(o, "sliding_window");
  s.logit_softcap = get<float>(o, "logit_softcap");
  return s;
}

dg::DeviceModel device_model_from_py(nb::handle o) {
  dg::DeviceModel m;
  if (o.is_none()) return m;
  m.num_sms = get<int>(o, "num_sms");
  m.blocks_per_sm = get<int>(o, "blocks_per_sm");
  return m;
}

dg::ExecutorConfig config_from_py(nb::handle o) {
  dg::ExecutorConfig c;
  c.spec = spec_from_py(o.attr("spec"));
  for (nb::handle s : o.attr("layer_specs")) c.layer_specs.push_back(spec_from_py(s));
  if (!o.attr("alibi_slopes").is_none()) c.alibi_slopes = get<std::vector<float>>(o, "alibi_slopes");
  c.num_layers = static_cast<int>(nb::len(nb::object(o.attr("layers"))));
  c.max_batch = get<int>(o, "max_batch");
  c.q_lens = get<std::vector<int>>(o, "q_lens");
  c.max_seq_len = get<int>(o, "max_seq_len");
  c.num_blocks = get<int>(o, "num_blocks");
  c.max_blocks_per_seq = get<int>(o, "max_blocks_per_seq");
  c.v2_threshold = get<int>(o, "v2_threshold");
  c.band_edges = get<std::vector<int>>(o, "band_edges");
  c.batch_buckets = get<std::vector<int>>(o, "batch_buckets");
  c.partition_size = get<int>(o, "partition_size");
  c.policy = get<dg::KernelPolicy>(o, "policy");
  c.device_model = device_model_from_py(o.attr("device_model"));
  c.measure_replays = get<int>(o, "measure_replays");
  c.band_select = get<dg::BandSelect>(o, "band_select");
  c.capture = get<dg::CapturePolicy>(o, "capture");
  c.backend = get<dg::BackendKind>(o, "backend");
  if (!o.attr("validation").is_none()) c.validation = get<dg::ValidationLevel>(o, "validation");
  c.append_kv = get<bool>(o, "append_kv");
  c.programmatic_launch = get<bool>(o, "programmatic_launch");
  c.memory_budget_bytes = get<std::size_t>(o, "memory_budget_bytes");
  c.log_level = get<std::string>(o, "log_level");
  return c;
}

nb::dict to_py(const dg::DeviceModel& m) {
  nb::dict d;
  d["num_sms"] = m.num_sms;
  d["blocks_per_sm"] = m.blocks_per_sm;
  return d;
}

nb::dict to_py(const dg::PlanCandidate& c) {
  nb::dict d;
  d["kernel"] = c.kernel;
  d["partition_size"] = c.partition_size;
  d["us"] = c.us;
  d["predicted_us"] = c.predicted_us;
  return d;
}

nb::dict to_py(const dg::PlanPrediction& p) {
  nb::dict d;
  d["len"] = p.len;
  d["us"] = p.us;
  d["roof_share"] = p.roof_share;
  d["loop_us"] = p.loop_us;
  d["fixed_us"] = p.fixed_us;
  d["merge_us"] = p.merge_us;
  d["launch_us"] = p.launch_us;
  d["issue_us"] = p.issue_us;
  return d;
}

nb::dict to_py(const dg::BucketPlan& p) {
  nb::dict d;
  d["group"] = p.group;
  d["batch"] = p.batch;
  d["q_len"] = p.q_len;
  d["band"] = p.band;
  d["band_lo"] = p.band_lo;
  d["band_hi"] = p.band_hi;
  d["kernel"] = p.kernel;
  d["partition_size"] = p.partition_size;
  d["max_partitions"] = p.max_partitions;
  d["grid"] = nb::make_tuple(p.grid_x, p.grid_y, p.grid_z);
  d["merge_grid"] = nb::make_tuple(p.merge_grid_x, p.merge_grid_y, p.merge_grid_z);
  d["workspace_bytes"] = p.workspace_bytes;
  d["launch_len"] = p.launch_len;
  d["design_len"] = p.design_len;
  d["window"] = p.window;
  d["blocks"] = p.blocks;
  d["target_blocks"] = p.target_blocks;
  d["live_blocks_at_band_lo"] = p.live_blocks_at_band_lo;
  d["waves"] = p.waves;
  d["predicted_lo"] = to_py(p.predicted_lo);
  d["predicted_mid"] = to_py(p.predicted_mid);
  d["predicted_hi"] = to_py(p.predicted_hi);
  d["predicted_regret"] = p.predicted_regret;
  d["candidates_scored"] = p.candidates_scored;
  d["reason"] = p.reason;
  d["reason_text"] = dg::describe_reason(p);
  d["graph_id"] = p.graph_id;
  nb::list cands;
  for (const auto& c : p.candidates) cands.append(to_py(c));
  d["candidates"] = cands;
  return d;
}

nb::list to_py(std::span<const dg::BucketPlan> plans) {
  nb::list l;
  for (const auto& p : plans) l.append(to_py(p));
  return l;
}

nb::dict to_py(const dg::GraphStats& g) {
  nb::dict d;
  d["graph_id"] = g.graph_id;
  d["batch"] = g.batch;
  d["q_len"] = g.q_len;
  d["band"] = g.band;
  d["last_band"] = g.last_band;
  d["band_lo"] = g.band_lo;
  d["band_hi"] = g.band_hi;
  d["buckets"] = g.buckets;
  d["kernel"] = g.kernel;
  d["partition_size"] = g.partition_size;
  d["captures"] = g.captures;
  d["updates"] = g.updates;
  d["reinstantiations"] = g.reinstantiations;
  d["replays"] = g.replays;
  d["nodes"] = g.nodes;
  d["capture_ms"] = g.capture_ms;
  d["instantiate_ms"] = g.instantiate_ms;
  d["measure_ms"] = g.measure_ms;
  d["bytes"] = g.bytes;
  d["switch_graph"] = g.switch_graph;
  d["branches"] = g.branches;
  d["band_replays"] = g.band_replays;
  d["band_kernels"] = g.band_kernels;
  d["group_kernels"] = g.group_kernels;
  d["group_band_kernels"] = g.group_band_kernels;
  d["band_launch_ids"] = g.band_launch_ids;
  return d;
}

nb::dict to_py(const dg::ExecutorStats& s) {
  nb::dict d;
  nb::list graphs;
  for (const auto& g : s.graphs) graphs.append(to_py(g));
  d["graphs"] = graphs;
  d["band_select"] = s.band_select;
  d["band_select_note"] = s.band_select_note;
  d["programmatic_launch"] = s.programmatic_launch;
  d["programmatic_launch_note"] = s.programmatic_launch_note;
  d["buckets"] = s.buckets;
  d["distinct_graphs"] = s.distinct_graphs;
  d["distinct_plans"] = s.distinct_plans;
  d["undecided_buckets"] = s.undecided_buckets;
  d["steps"] = s.steps;
  d["rejected_steps"] = s.rejected_steps;
  d["total_captures"] = s.total_captures;
  d["capture_ms"] = s.capture_ms;
  d["instantiate_ms"] = s.instantiate_ms;
  d["measure_ms"] = s.measure_ms;
  d["measured_buckets"] = s.measured_buckets;
  d["candidate_graphs"] = s.candidate_graphs;
  d["rebinds"] = s.rebinds;
  d["graph_updates"] = s.graph_updates;
  d["graph_reinstantiations"] = s.graph_reinstantiations;
  d["input_downloads"] = s.input_downloads;
  d["staging_copy_bytes"] = s.staging_copy_bytes;
  d["bad_block_reports"] = s.bad_block_reports;
  // ExecutorStats::replays(kind, group), evaluated here so that the Python side does not restate its
  // rule: per layer group, and replays_v1 / replays_v2 summed over every group (C++ replays(kind)
  // counts layer group 0's only, which read as "V2 never ran" while group 1 ran it every step).
  std::size_t groups = 1;  // every graph names each layer group's kernels
  for (const auto& g : s.graphs) groups = std::max({groups, g.group_kernels.size(), g.group_band_kernels.size()});
  nb::list per_group;  // [group] -> [V1 replays, V2 replays]
  long long v1 = 0, v2 = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    const long long g1 = s.replays(dg::KernelKind::kV1, static_cast<int>(g));
    const long long g2 = s.replays(dg::KernelKind::kV2, static_cast<int>(g));
    per_group.append(nb::make_tuple(g1, g2));
    v1 += g1;
    v2 += g2;
  }
  d["replays_v1"] = v1;
  d["replays_v2"] = v2;
  d["group_replays"] = per_group;
  return d;
}

nb::dict to_py(const dg::MemoryReport& m) {
  nb::dict d;
  d["static_buffers"] = m.static_buffers;
  d["workspace"] = m.workspace;
  d["graphs"] = m.graphs;
  return d;
}

StepResultType::StepResultType(nb::handle cls) : cls_(nb::borrow(cls)) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls_.ptr());
  for (std::size_t i = 0; i < std::size(kFields); ++i) {
    names_[i] = nb::steal(PyUnicode_InternFromString(kFields[i]));
    PyObject* d = PyDict_GetItemWithError(type->tp_dict, names_[i].ptr());  // borrowed
    if (d && Py_TYPE(d) == &PyMemberDescr_Type) {
      const PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(d)->d_member;
      if (m->type == T_OBJECT_EX && !(m->flags & READONLY)) offsets_[i] = m->offset;
    }
    if (offsets_[i] < 0) direct_ = false;  // not the slotted class we know: set attributes instead
  }
  PyErr_Clear();
}

nb::object StepResultType::make(const dg::StepResult& r) const {
  auto* type = reinterpret_cast<PyTypeObject*>(cls_.ptr());
  PyObject* values[std::size(kFields)] = {
      PyLong_FromLong(r.bucket.value), PyLong_FromLong(r.bucket_batch_size), PyLong_FromLong(r.band),
      PyLong_FromLong(r.band_hi), nb::cast(r.kernel).release().ptr(), PyLong_FromLong(r.partition_size),
      PyBool_FromLong(r.band_on_device), PyBool_FromLong(r.captured), PyBool_FromLong(r.measured),
      PyLong_FromLong(r.graph_id), PyLong_FromLong(r.launch_id), PyLong_FromLong(r.q_len)};
  // object.__new__ (a plain class: tp_alloc, zeroed slots); the references in `values` move into
  // its slots, or are released below.
  nb::object obj = nb::steal(direct_ ? type->tp_alloc(type, 0) : type->tp_new(type, nb::tuple().ptr(), nullptr));
  bool ok = obj.is_valid();
  for (std::size_t i = 0; i < std::size(kFields); ++i) {
    if (ok && direct_) {
      *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj.ptr()) + offsets_[i]) = values[i];
      continue;
    }
    ok = ok && PyObject_SetAttr(obj.ptr(), names_[i].ptr(), values[i]) == 0;
    Py_XDECREF(values[i]);
  }
  if (!ok) throw nb::python_error();
  return obj;
}

}  // namespace dgpy
