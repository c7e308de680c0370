// decodegraph::Error and its kinds -> the Python exceptions of decodegraph/_errors.py:
//   CorruptedStepReport -> decodegraph.CorruptedStepReport (an InvalidArgument), with .kind,
//                   .first_step, .last_step, .step_refused, .sequence, .block_table_column
//   InvalidArgument -> decodegraph.InvalidArgument (a ValueError)
//   OutOfMemory     -> decodegraph.OutOfMemory     (a MemoryError)
//   CudaError       -> decodegraph.CudaError, with .code (the cudaError_t) and .context_lost
//   Error           -> decodegraph.Error           (a RuntimeError; the base of all four)
// The message is the C++ what() in Python's words (python_wording below): the names a Python caller
// passed (seq_lens, not inputs.seq_lens; block_tables.shape[1], not inputs.block_table_stride) and
// the configuration as Python spells it (validation="full", not ValidationLevel::kFull).
#include <nanobind/nanobind.h>

#include <string>
#include <string_view>
#include <utility>

#include "decodegraph/error.hpp"

namespace dgpy {

namespace nb = nanobind;
namespace dg = decodegraph;

namespace {

// C++ spellings in the library's messages -> what a Python caller wrote. Whole-token replacements,
// longest first where one is the prefix of another.
constexpr std::pair<std::string_view, std::string_view> kWords[] = {
    {"inputs.block_table_stride", "block_tables.shape[1] (the block-table stride)"},
    {"inputs.", ""},
    {"config().", "config."},
    {"ValidationLevel::kCheap", "validation=\"cheap\""},
    {"ValidationLevel::kFull", "validation=\"full\""},
    {"BandSelect::kDevice", "band_select=\"device\""},
    {"BandSelect::kHost", "band_select=\"host\""},
    {"KernelPolicy::kMeasured", "policy=\"measured\""},
    {"kCheap", "validation=\"cheap\""},
    {"kFull", "validation=\"full\""},
};

bool word_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

std::string python_wording(std::string_view what) {
  std::string out;
  out.reserve(what.size() + 32);
  std::size_t i = 0;
  while (i < what.size()) {
    bool replaced = false;
    // A C++ word starts where the previous character is not part of an identifier.
    if (i == 0 || !word_char(what[i - 1])) {
      for (const auto& [from, to] : kWords) {
        if (what.substr(i, from.size()) != from) continue;
        const std::size_t end = i + from.size();
        if (from.back() != '.' && end < what.size() && word_char(what[end])) continue;  // kFullX: not ours
        out += to;
        i = end;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += what[i++];
  }
  return out;
}

nb::object error_class(const char* name) {
  return nb::module_::import_("decodegraph._errors").attr(name);
}

void raise(const char* cls_name, const char* what) {
  nb::object cls = error_class(cls_name);
  PyErr_SetString(cls.ptr(), python_wording(what).c_str());
}

void raise_corrupted(const dg::CorruptedStepReport& e) {
  nb::object cls = error_class("CorruptedStepReport");
  nb::object exc = cls(nb::str(python_wording(e.what()).c_str()), dg::to_string(e.kind()), e.first_step(), e.last_step(),
                       e.step_refused(), e.sequence(), e.block_table_column());
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

void raise_cuda(const dg::CudaError& e) {
  nb::object cls = error_class("CudaError");
  nb::object exc = cls(nb::str(python_wording(e.what()).c_str()), e.code(), e.context_lost());
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
