#pragma once
#include "sim_runtime.hpp"
