// Umbrella header.
#pragma once

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/executor.hpp"
#include "decodegraph/numeric.hpp"
#include "decodegraph/types.hpp"
#include "decodegraph/version.hpp"
