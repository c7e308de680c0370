// decodegraph._core: the nanobind extension over the public C++ API (include/decodegraph/). The
// Python package (python/decodegraph/) wraps it in Python idiom: dataclasses, docstrings, views as
// numpy / torch arrays. Parts: enums and build facts here; errors.cpp (exception kinds),
// tensor.cpp (arrays in and out), convert.cpp (structs), eager.cpp (eager calls), executor.cpp.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "convert.hpp"
#include "decodegraph/attention.hpp"
#include "decodegraph/executor.hpp"
#include "decodegraph/fault.hpp"
#include "decodegraph/version.hpp"

namespace dgpy {
void register_errors();
void bind_eager(nb::module_& m);
void bind_executor(nb::module_& m);

namespace {

void bind_enums(nb::module_& m) {
  nb::enum_<dg::DType>(m, "DType")
      .value("FP16", dg::DType::kFloat16)
      .value("BF16", dg::DType::kBFloat16)
      .value("FP32", dg::DType::kFloat32);
  nb::enum_<dg::KVLayout>(m, "KVLayout").value("VLLM", dg::KVLayout::kVLLM).value("NHD", dg::KVLayout::kNHD);
  nb::enum_<dg::KVCacheDType>(m, "KVCacheDType")
      .value("AUTO", dg::KVCacheDType::kAuto)
      .value("FP8_E4M3", dg::KVCacheDType::kFp8E4M3)
      .value("FP8_E5M2", dg::KVCacheDType::kFp8E5M2);
  nb::enum_<dg::KernelKind>(m, "KernelKind").value("V1", dg::KernelKind::kV1).value("V2", dg::KernelKind::kV2);
  nb::enum_<dg::BackendKind>(m, "BackendKind")
      .value("AUTO", dg::BackendKind::kAuto)
      .value("CUDA", dg::BackendKind::kCuda)
      .value("HOST", dg::BackendKind::kHost);
  nb::enum_<dg::CapturePolicy>(m, "CapturePolicy")
      .value("UP_FRONT", dg::CapturePolicy::kUpFront)
      .value("LAZY", dg::CapturePolicy::kLazy);
  nb::enum_<dg::ValidationLevel>(m, "ValidationLevel")
      .value("CHEAP", dg::ValidationLevel::kCheap)
      .value("FULL", dg::ValidationLevel::kFull);
  nb::enum_<dg::KernelPolicy>(m, "KernelPolicy")
      .value("AUTO", dg::KernelPolicy::kAuto)
      .value("THRESHOLD", dg::KernelPolicy::kThreshold)
      .value("MEASURED", dg::KernelPolicy::kMeasured);
  nb::enum_<dg::BandSelect>(m, "BandSelect").value("HOST", dg::BandSelect::kHost).value("DEVICE", dg::BandSelect::kDevice);
  nb::enum_<dg::PlanReason>(m, "PlanReason")
      .value("ABOVE_THRESHOLD", dg::PlanReason::kAboveThreshold)
      .value("THRESHOLD_RULE", dg::PlanReason::kThresholdRule)
      .value("MEASURED_FASTEST", dg::PlanReason::kMeasuredFastest)
      .value("NOT_MEASURED", dg::PlanReason::kNotMeasured)
      .value("LEAST_REGRET", dg::PlanReason::kLeastRegret);
  nb::enum_<dg::fault::Site>(m, "FaultSite")
      .value("ALLOC", dg::fault::Site::kAlloc)
      .value("MEMCPY", dg::fault::Site::kMemcpy)
      .value("CAPTURE_BEGIN", dg::fault::Site::kCaptureBegin)
      .value("CAPTURE_END", dg::fault::Site::kCaptureEnd)
      .value("INSTANTIATE", dg::fault::Site::kInstantiate)
      .value("GRAPH_UPDATE", dg::fault::Site::kGraphUpdate)
      .value("GRAPH_LAUNCH", dg::fault::Site::kGraphLaunch)
      .value("KERNEL_LAUNCH", dg::fault::Site::kKernelLaunch);
}

void bind_functions(nb::module_& m) {
  using namespace nb::literals;
  m.def("version", [] { return std::string(dg::version()); });
  m.def("built_with_cuda", &dg::built_with_cuda);
  m.def("cuda_device_available", &dg::cuda_device_available);
  m.attr("CUDA_ARCHITECTURES") = DG_CUDA_ARCHITECTURES;
  m.attr("CUDA_COMPILER_VERSION") = DG_CUDA_COMPILER_VERSION;
  m.attr("KV_CACHE_ALIGNMENT_BYTES") = 16;
  m.attr("SUPPORTED_HEAD_SIZES") = std::vector<int>(dg::kSupportedHeadSizes.begin(), dg::kSupportedHeadSizes.end());
  m.attr("SUPPORTED_BLOCK_SIZES") = std::vector<int>(dg::kSupportedBlockSizes.begin(), dg::kSupportedBlockSizes.end());
  m.def("validate_spec", [](nb::handle spec) { dg::validate_spec(spec_from_py(spec)); }, "spec"_a);
  m.def("default_band_edges", &dg::default_band_edges, "max_seq_len"_a, "v2_threshold"_a);
  m.def("default_batch_buckets", &dg::default_batch_buckets, "max_batch"_a);
  m.def("host_device_model", [](nb::handle spec) { return to_py(dg::host_device_model(spec_from_py(spec))); },
        "spec"_a);
  m.def("balanced_partition_size", &dg::balanced_partition_size, "design_len"_a, "min_parts"_a, "block_size"_a);
  m.def(
      "plan_buckets",
      [](nb::handle config) {
        dg::ExecutorConfig cfg = config_from_py(config);
        if (cfg.num_layers == 0)  // planning reads no layer, only one spec per layer where given
          cfg.num_layers = cfg.layer_specs.empty() ? 1 : static_cast<int>(cfg.layer_specs.size());
        std::vector<dg::BucketPlan> plans;
        {
          nb::gil_scoped_release nogil;
          plans = dg::plan_buckets(cfg);
        }
        return to_py(plans);
      },
      "config"_a);
  // The fault seam (fault.hpp), for tests of the error paths.
  m.def("fault_arm", &dg::fault::arm, "site"_a, "skip"_a = 0, "count"_a = 1);
  m.def("fault_disarm", &dg::fault::disarm, "site"_a);
  m.def("fault_disarm_all", &dg::fault::disarm_all);
  m.def("fault_fired", &dg::fault::fired, "site"_a);
}

}  // namespace
}  // namespace dgpy

NB_MODULE(_core, m) {
  m.doc() = "decodegraph's C++ extension; use the decodegraph package, which wraps it.";
  dgpy::bind_enums(m);
  dgpy::register_errors();
  dgpy::bind_functions(m);
  dgpy::bind_eager(m);
  dgpy::bind_executor(m);
}
