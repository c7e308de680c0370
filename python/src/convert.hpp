// Python <-> C++ for the library's plain structs, one function per struct. Python side: the
// dataclasses of decodegraph/_types.py (read by attribute name; enum fields already normalised to
// the enums bound in module.cpp), and plain dicts going back (the Python layer builds dataclasses
// from them by keyword). A field added to a C++ struct is added here and in _types.py.
#pragma once

#include <nanobind/nanobind.h>

#include <iterator>
#include <span>

#include "decodegraph/executor.hpp"

namespace dgpy {

namespace nb = nanobind;
namespace dg = decodegraph;

dg::AttentionSpec spec_from_py(nb::handle spec);
dg::DeviceModel device_model_from_py(nb::handle model);  // None -> zeros (queried / modelled)
/// Every ExecutorConfig field but `layers` (executor.cpp imports those, they are arrays) and the
/// test hooks measure_clock / switch_probe, which are not bound.
dg::ExecutorConfig config_from_py(nb::handle config);

nb::dict to_py(const dg::DeviceModel& m);
nb::dict to_py(const dg::PlanCandidate& c);
nb::dict to_py(const dg::PlanPrediction& p);
nb::dict to_py(const dg::BucketPlan& p);
nb::list to_py(std::span<const dg::BucketPlan> plans);
nb::dict to_py(const dg::GraphStats& g);
nb::dict to_py(const dg::ExecutorStats& s);
nb::dict to_py(const dg::MemoryReport& m);
/// Makes decodegraph.StepResult objects (the dataclass itself, not a dict: step() is the hot path,
/// and StepResult(**fields) costs ~0.5 us of the 2 us the Python step may add to the C++ one).
/// StepResult is slotted: its objects are allocated and their slots written directly, in field
/// order, each with its reference; any other class `cls` gets its attributes set one by one.
class StepResultType {
 public:
  explicit StepResultType(nb::handle cls);
  nb::object make(const dg::StepResult& r) const;

  static constexpr const char* kFields[] = {"bucket",     "bucket_batch_size", "band",     "band_hi",
                                            "kernel",     "partition_size",    "band_on_device",
                                            "captured",   "measured",          "graph_id", "launch_id",
                                            "q_len"};

 private:
  nb::object cls_;
  nb::object names_[std::size(kFields)];
  Py_ssize_t offsets_[std::size(kFields)] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  bool direct_ = true;
};

}  // namespace dgpy
