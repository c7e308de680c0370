// types.hpp / version.hpp helpers and the fp16 / bf16 conversions of numeric.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <regex>
#include <string>

#include "decodegraph/error.hpp"
#include "decodegraph/numeric.hpp"
#include "decodegraph/types.hpp"
#include "decodegraph/version.hpp"

namespace {

using namespace decodegraph;

float f(uint32_t bits) { return bits_float(bits); }

// ---------------------------------------------------------------- fp16

TEST(Fp16, KnownValues) {
  EXPECT_EQ(float_to_fp16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_fp16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16_bits(65504.0f), 0x7bff);        // largest finite
  EXPECT_EQ(float_to_fp16_bits(65519.0f), 0x7bff);        // below the midpoint to 2^16: rounds down
  EXPECT_EQ(float_to_fp16_bits(65520.0f), 0x7c00);        // the midpoint: ties to even = inf
  EXPECT_EQ(float_to_fp16_bits(1e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16_bits(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -25)), 0x0000);  // half of it: tie to even (0)
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_fp16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: to even
  EXPECT_EQ(float_to_fp16_bits(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie: to even (up)
  EXPECT_EQ(float_to_fp16_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_TRUE(std::isnan(fp16_bits_to_float(float_to_fp16_bits(NAN))));

  EXPECT_EQ(fp16_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_bits_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_bits_to_float(0x7c00), INFINITY);
  EXPECT_EQ(fp16_bits_to_float(0xfc00), -INFINITY);
  EXPECT_TRUE(std::signbit(fp16_bits_to_float(0x8000)));
  EXPECT_TRUE(std::isnan(fp16_bits_to_float(0x7e00)));
}

TEST(Fp16, EveryBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float v = fp16_bits_to_float(h);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(fp16_bits_to_float(float_to_fp16_bits(v)))) << b;
      continue;
    }
    ASSERT_EQ(float_to_fp16_bits(v), h) << "bits " << b << " value " << v;
  }
}

// Rounding matches round-to-nearest-even computed independently in double for random floats.
TEST(Fp16, RoundsToNearestEvenOnRandomFloats) {
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    // Magnitudes from subnormal fp16 up to past fp16 max.
    const float v = std::ldexp(static_cast<float>(state >> 8) / 16777216.0f, (i % 44) - 26) *
                    ((state & 1) ? -1.f : 1.f);
    const uint16_t h = float_to_fp16_bits(v);
    const double got = fp16_bits_to_float(h);
    // Neighbours of got: the result must be at least as close as either.
    const double up = fp16_bits_to_float(static_cast<uint16_t>(h + 1));
    const double dn = (h & 0x7fff) ? double(fp16_bits_to_float(static_cast<uint16_t>(h - 1))) : got;
    if (std::isinf(got)) {
      ASSERT_GE(std::fabs(double(v)), 65520.0) << v;
      continue;
    }
    ASSERT_LE(std::fabs(got - v), std::fabs(up - v)) << v;
    ASSERT_LE(std::fabs(got - v), std::fabs(dn - v)) << v;
  }
}

// ---------------------------------------------------------------- bf16

TEST(Bf16, KnownValues) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-1.0f), 0xbf80);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(f(0x3f808000)), 0x3f80);  // 1 + 2^-8: tie, to even (down)
  EXPECT_EQ(float_to_bf16_bits(f(0x3f818000)), 0x3f82);  // 1 + 3*2^-8: tie, to even (up)
  EXPECT_EQ(float_to_bf16_bits(f(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(float_to_bf16_bits(f(0x3f807fff)), 0x3f80);  // just below the tie
  EXPECT_EQ(float_to_bf16_bits(f(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(float_to_bf16_bits(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(f(0x00000001)), 0x0000);  // tiny subnormal rounds to 0
  EXPECT_EQ(float_to_bf16_bits(f(0x00010000)), 0x0001);  // smallest bf16 subnormal
  const uint16_t nan = float_to_bf16_bits(f(0x7f800001));  // NaN with low payload stays NaN
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(nan)));
  EXPECT_EQ(bf16_bits_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0x4049), 3.140625f);
}

TEST(Bf16, EveryBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float v = bf16_bits_to_float(h);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(v)))) << b;
      continue;
    }
    ASSERT_EQ(float_to_bf16_bits(v), h) << "bits " << b;
  }
}

TEST(Numeric, LoadStoreAsFloat) {
  uint16_t h[2];
  float s[2];
  store_from_float(DType::kFloat16, h, 1, 0.5f);
  store_from_float(DType::kBFloat16, h, 0, -3.0f);
  store_from_float(DType::kFloat32, s, 1, 1.25f);
  EXPECT_EQ(h[1], 0x3800);
  EXPECT_EQ(h[0], 0xc040);
  EXPECT_EQ(load_as_float(DType::kFloat16, h, 1), 0.5f);
  EXPECT_EQ(load_as_float(DType::kBFloat16, h, 0), -3.0f);
  EXPECT_EQ(load_as_float(DType::kFloat32, s, 1), 1.25f);
}

// ---------------------------------------------------------------- types.hpp, version.hpp

TEST(Types, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_STREQ(to_string(DType::kFloat16), "fp16");
  EXPECT_STREQ(to_string(DType::kBFloat16), "bf16");
  EXPECT_STREQ(to_string(DType::kFloat32), "fp32");
  EXPECT_STREQ(to_string(KVLayout::kVLLM), "vllm");
  EXPECT_STREQ(to_string(KVLayout::kNHD), "nhd");
  EXPECT_STREQ(to_string(KernelKind::kV1), "v1");
  EXPECT_STREQ(to_string(KernelKind::kV2), "v2");
  for (const char* n : {"fp16", "float16", "half", "FP16"}) EXPECT_EQ(parse_dtype(n), DType::kFloat16) << n;
  for (const char* n : {"bf16", "bfloat16"}) EXPECT_EQ(parse_dtype(n), DType::kBFloat16) << n;
  for (const char* n : {"fp32", "float32", "float"}) EXPECT_EQ(parse_dtype(n), DType::kFloat32) << n;
  EXPECT_EQ(parse_layout("vllm"), KVLayout::kVLLM);
  EXPECT_EQ(parse_layout("nhd"), KVLayout::kNHD);
  // Names round-trip through to_string.
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) EXPECT_EQ(parse_dtype(to_string(d)), d);
  for (KVLayout l : {KVLayout::kVLLM, KVLayout::kNHD}) EXPECT_EQ(parse_layout(to_string(l)), l);
}

TEST(Types, ParseErrorsNameValueAndAllowed) {
  try {
    parse_dtype("fp8");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("dtype"), std::string::npos) << m;
    EXPECT_NE(m.find("fp8"), std::string::npos) << m;
    EXPECT_NE(m.find("fp16, float16, half, bf16, bfloat16, fp32, float32, float"), std::string::npos) << m;
  }
  try {
    parse_layout("hnd");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layout"), std::string::npos) << m;
    EXPECT_NE(m.find("hnd"), std::string::npos) << m;
    EXPECT_NE(m.find("vllm, nhd"), std::string::npos) << m;
  }
  EXPECT_THROW(dtype_size(static_cast<DType>(9)), Error);
}

TEST(Types, SpecHelpers) {
  AttentionSpec s;
  s.head_size = 128;
  s.num_kv_heads = 8;
  s.num_q_heads = 32;
  s.block_size = 16;
  EXPECT_FLOAT_EQ(s.effective_scale(), 1.0f / std::sqrt(128.0f));
  s.scale = -1.0f;  // a sign error, not the default: rejected (tests/api/test_errors.cpp)
  EXPECT_THROW(validate_spec(s), InvalidArgument);
  s.scale = 0.25f;
  EXPECT_EQ(s.effective_scale(), 0.25f);
  EXPECT_EQ(s.group_size(), 4);
  EXPECT_EQ(s.block_elems(), 16u * 8u * 128u);
  EXPECT_NO_THROW(validate_spec(s));
}

TEST(Version, MatchesBuild) {
  EXPECT_TRUE(std::regex_match(std::string(version()), std::regex(R"(\d+\.\d+\.\d+)"))) << version();
  EXPECT_EQ(built_with_cuda(), static_cast<bool>(DECODEGRAPH_HAS_CUDA));
}

}  // namespace
