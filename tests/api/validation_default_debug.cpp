// One of the two translation units of test_validation_default.cpp (validation_default_tu.hpp).
#ifdef NDEBUG
#error "this file must be compiled without NDEBUG (tests/api/CMakeLists.txt)"
#endif
#define DG_TU_FUNCTION validation_seen_without_ndebug
#include "validation_default_tu.inc"
