#pragma once
#include "sim_runtime.hpp"
#include "decodegraph/numeric.hpp"
struct __half { uint16_t x; };
inline float __half2float(__half h) { return decodegraph::fp16_bits_to_float(h.x); }
inline __half __float2half_rn(float f) { return __half{decodegraph::float_to_fp16_bits(f)}; }
