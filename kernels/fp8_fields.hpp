// The value of an fp8 code spelled out from its bit fields in float64 (types.hpp's formats),
// independently of numeric.hpp's codecs: the float64 reference reads fp8 caches with it, and the
// tests hold the codecs against it.
#pragma once

#include <cmath>
#include <cstdint>

#include "decodegraph/types.hpp"

namespace decodegraph::detail {

/// (-1)^s 2^(e - bias) (1 + m / 2^M), subnormals 2^(1 - bias) m / 2^M; E4M3FN's S.1111.111 and
/// E5M2's exponent 31 with m != 0 are NaN, E5M2's exponent 31 with m = 0 is inf.
inline double fp8_value(KVCacheDType kv, std::uint8_t code) {
  const bool e5m2 = kv == KVCacheDType::kFp8E5M2;
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const int e = (code & 0x7f) >> mbits, m = code & ((1 << mbits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  if (e5m2 && e == 31) return m == 0 ? sign * INFINITY : NAN;
  if (!e5m2 && (code & 0x7f) == 0x7f) return NAN;
  if (e == 0) return sign * std::ldexp(double(m), 1 - bias - mbits);
  return sign * std::ldexp(1.0 + double(m) / (1 << mbits), e - bias);
}

}  // namespace decodegraph::detail
