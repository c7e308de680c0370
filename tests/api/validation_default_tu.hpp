// What one translation unit sees of the validation default: validation_default_ndebug.cpp and
// validation_default_debug.cpp define these, compiled with and without NDEBUG (tests/api/CMakeLists.txt).
#pragma once

#include "decodegraph/executor.hpp"

namespace dgtest {

struct ValidationSeen {
  decodegraph::ValidationLevel constant;  // kDefaultValidation as that file sees it
  decodegraph::ValidationLevel field;     // ExecutorConfig{}.validation, built in that file
  decodegraph::ValidationLevel resolved;  // what an Executor configured in that file uses
  bool ndebug;                            // NDEBUG was defined there
};

ValidationSeen validation_seen_with_ndebug();
ValidationSeen validation_seen_without_ndebug();

}  // namespace dgtest
