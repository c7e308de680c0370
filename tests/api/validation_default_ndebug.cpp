// One of the two translation units of test_validation_default.cpp (validation_default_tu.hpp).
#ifndef NDEBUG
#error "this file must be compiled with NDEBUG (tests/api/CMakeLists.txt)"
#endif
#define DG_TU_FUNCTION validation_seen_with_ndebug
#include "validation_default_tu.inc"
