#pragma once
#include "sim_runtime.hpp"
#include "decodegraph/numeric.hpp"
struct __half { uint16_t x; };
struct __half2 { __half x, y; };
inline float __half2float(__half h) { return decodegraph::fp16_bits_to_float(h.x); }
inline __half __float2half_rn(float f) { return __half{decodegraph::float_to_fp16_bits(f)}; }
// half2 <-> float2, element by element (the device converts a pair per instruction, same rounding).
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
