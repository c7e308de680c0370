// decodegraph::Error and its kinds -> the Python exceptions of decodegraph/_errors.py:
//   CorruptedStepReport -> decodegraph.CorruptedStepReport (an InvalidArgument), with .kind,
//                   .first_step, .last_step, .step_refused, .sequence, .block_table_column
//   InvalidArgument -> decodegraph.InvalidArgument (a ValueError)
//   OutOfMemory     -> decodegraph.OutOfMemory     (a MemoryError)
//   CudaError       -> decodegraph.CudaError, with .code (the cudaError_t) and .context_lost
//   Error           -> decodegraph.Error           (a RuntimeError; the base of all four)
// The message is the C++ what(), unchanged.
#include <nanobind/nanobind.h>

#include "decodegraph/error.hpp"

namespace dgpy {

namespace nb = nanobind;
namespace dg = decodegraph;

namespace {

nb::object error_class(const char* name) {
  return nb::module_::import_("decodegraph._errors").attr(name);
}

void raise(const char* cls_name, const char* what) {
  nb::object cls = error_class(cls_name);
  PyErr_SetString(cls.ptr(), what);
}

void raise_corrupted(const dg::CorruptedStepReport& e) {
  nb::object cls = error_class("CorruptedStepReport");
  nb::object exc = cls(e.what(), dg::to_string(e.kind()), e.first_step(), e.last_step(), e.step_refused(),
                       e.sequence(), e.block_table_column());
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

void raise_cuda(const dg::CudaError& e) {
  nb::object cls = error_class("CudaError");
  nb::object exc = cls(e.what(), e.code(), e.context_lost());
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

}  // namespace

void register_errors() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const dg::CorruptedStepReport& e) {
      raise_corrupted(e);
    } catch (const dg::InvalidArgument& e) {
      raise("InvalidArgument", e.what());
    } catch (const dg::OutOfMemory& e) {
      raise("OutOfMemory", e.what());
    } catch (const dg::CudaError& e) {
      raise_cuda(e);
    } catch (const dg::Error& e) {
      raise("Error", e.what());
    }
  });
}

}  // namespace dgpy
