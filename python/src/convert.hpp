// Python <-> C++ for the library's plain structs, one function per struct. Python side: the
// dataclasses of decodegraph/_types.py (read by attribute name; enum fields already normalised to
// the enums bound in module.cpp), and plain dicts going back (the Python layer builds dataclasses
// from them by keyword). A field added to a C++ struct is added here and in _types.py.
#pragma once

#include <nanobind/nanobind.h>

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
/// A decodegraph.StepResult (the dataclass itself, class `cls`, not a dict: step() is the hot path).
nb::object step_result_to_py(const dg::StepResult& r, nb::handle cls);

}  // namespace dgpy
