// --plan-only: every bucket's plan for the host model (or --device-model), as a table and, with
// --json, as one object per bucket; with --capture-compare also what capturing them costs under
// each band choice. No cache is allocated and no step runs.
#pragma once

#include <cstdio>

#include "setup.hpp"

namespace dgloop {

/// Prints to `out` (and writes --json); returns the exit status.
int plan_only(const Setup& s, std::FILE* out);

}  // namespace dgloop
