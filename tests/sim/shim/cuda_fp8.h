#pragma once
#include "sim_runtime.hpp"
// The fp8 code types the kernels name (one byte each); conversions live in sim_device_ops.hpp.
struct __nv_fp8_e4m3 { uint8_t __x; };
struct __nv_fp8_e5m2 { uint8_t __x; };
