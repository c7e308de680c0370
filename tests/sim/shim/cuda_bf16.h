#pragma once
#include "sim_runtime.hpp"
#include "decodegraph/numeric.hpp"
struct __nv_bfloat16 { uint16_t x; };
inline float __bfloat162float(__nv_bfloat16 h) { return decodegraph::bf16_bits_to_float(h.x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{decodegraph::float_to_bf16_bits(f)}; }
