// Two configuration contracts: the log level (an explicit ExecutorConfig::log_level in any case,
// an unknown one rejected; DECODEGRAPH_LOG_LEVEL in any case, an unknown one warned about once and
// the default kept) and the softmax scale (0 selects 1/sqrt(head_size); negative and non-finite
// values are rejected, naming spec.scale).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "rel_util.hpp"

namespace dgrel {
namespace {

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// ---------------------------------------------------------------- log level

/// Sets DECODEGRAPH_LOG_LEVEL for one test and restores what was there.
class LogLevelEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv(kVar)) saved_ = v;
  }
  void TearDown() override {
    if (saved_)
      setenv(kVar, saved_->c_str(), 1);
    else
      unsetenv(kVar);
  }
  static void set(const char* value) { setenv(kVar, value, 1); }
  /// stderr (where the library's logger writes) while constructing an executor and running a step.
  static std::string construct_and_step(Rig& rig) {
    ::testing::internal::CaptureStderr();
    try {
      Executor ex(rig.cfg);
      rig.fill_step_buffers(ex);
      const Inputs in = rig.random_inputs(3, 1, 600);
      ex.step(in.view());
      EXPECT_TRUE(rig.check_step(ex, in));
    } catch (...) {
      ::testing::internal::GetCapturedStderr();
      throw;
    }
    return ::testing::internal::GetCapturedStderr();
  }
  static constexpr const char* kVar = "DECODEGRAPH_LOG_LEVEL";
  std::optional<std::string> saved_;
};

TEST_F(LogLevelEnv, AnyCaseIsAccepted) {
  Rig rig;
  rig.cfg.log_level = "";  // read the environment
  set("DEBUG");
  std::string err;
  ASSERT_NO_THROW(err = construct_and_step(rig));
  // At debug level the constructor logs its plan table; at the default (warn) it does not.
  EXPECT_NE(err.find("plans:"), std::string::npos) << err;
  set("Warning");
  ASSERT_NO_THROW(err = construct_and_step(rig));
  EXPECT_EQ(err.find("plans:"), std::string::npos) << err;
}

TEST_F(LogLevelEnv, UnknownValueWarnsOnceAndKeepsTheDefault) {
  Rig rig;
  rig.cfg.log_level = "";
  set("verbose-please");
  std::string first, second;
  ASSERT_NO_THROW(first = construct_and_step(rig));
  ASSERT_NO_THROW(second = construct_and_step(rig));
  EXPECT_EQ(count(first, "DECODEGRAPH_LOG_LEVEL = \"verbose-please\""), 1) << first;
  EXPECT_NE(first.find("using the default, warn"), std::string::npos) << first;
  EXPECT_EQ(count(second, "DECODEGRAPH_LOG_LEVEL"), 0) << "warned twice:\n" << second;
  // The default (warn) is in force: no debug output.
  EXPECT_EQ(first.find("plans:"), std::string::npos) << first;
  // A different bad value is worth its own warning.
  set("LOUD");
  const std::string third = construct_and_step(rig);
  EXPECT_EQ(count(third, "DECODEGRAPH_LOG_LEVEL = \"LOUD\""), 1) << third;
}

TEST_F(LogLevelEnv, ExplicitLevelWinsAndMustBeValid) {
  Rig rig;
  set("not-a-level-either");
  rig.cfg.log_level = "Off";  // any case; the environment is not read, so no warning
  std::string err;
  ASSERT_NO_THROW(err = construct_and_step(rig));
  EXPECT_EQ(count(err, "DECODEGRAPH_LOG_LEVEL"), 0) << err;
  rig.cfg.log_level = "DEBUG";
  ASSERT_NO_THROW(err = construct_and_step(rig));
  EXPECT_NE(err.find("plans:"), std::string::npos) << err;
  for (const char* bad : {"loud", "debug2", " info"}) {
    rig.cfg.log_level = bad;
    try {
      Executor ex(rig.cfg);
      ADD_FAILURE() << "log_level = \"" << bad << "\" was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("log_level = ") + bad), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("trace, debug, info, warn, err, critical, off"), std::string::npos)
          << e.what();
    }
  }
}

// ---------------------------------------------------------------- softmax scale

TEST(SpecScale, NegativeAndNonFiniteAreRejectedNamingSpecScale) {
  AttentionSpec s;
  s.num_q_heads = 4;
  s.num_kv_heads = 2;
  s.head_size = 64;
  s.block_size = 16;
  for (float bad : {-0.125f, -1.0f, -std::numeric_limits<float>::denorm_min(),
                    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    s.scale = bad;
    try {
      validate_spec(s);
      ADD_FAILURE() << "scale " << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("spec.scale = "), std::string::npos) << what;
      EXPECT_NE(what.find("0 (selects 1/sqrt(head_size)) or a finite value > 0"), std::string::npos) << what;
    }
  }
  s.scale = -0.125f;
  try {
    validate_spec(s);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("spec.scale = -0.125"), std::string::npos) << e.what();
  }
  for (float ok : {0.0f, -0.0f, 1e-30f, 0.125f, 3.0f}) {
    s.scale = ok;
    EXPECT_NO_THROW(validate_spec(s)) << ok;
  }
}

TEST(SpecScale, ExecutorAndEagerCallsRejectANegativeScale) {
  Rig rig;
  rig.cfg.spec.scale = -0.125f;
  EXPECT_THROW(Executor ex(rig.cfg), InvalidArgument);
  // The eager host call checks the same spec.
  rig.cfg.spec.scale = 0.0f;
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(2, 1, 300);
  DecodeArgs a;
  a.spec = rig.cfg.spec;
  a.spec.scale = -0.125f;
  a.num_seqs = in.num_seqs;
  a.max_seq_len = 300;
  a.block_table_stride = in.stride;
  a.num_blocks = rig.cfg.num_blocks;
  a.q = ex.query(0);
  a.out = ex.output(0);
  a.k_cache = rig.k_caches[0].data();
  a.v_cache = rig.v_caches[0].data();
  a.block_tables = in.block_tables.data();
  a.seq_lens = in.seq_lens.data();
  EXPECT_THROW(host::paged_attention_v1(a), InvalidArgument);
}

TEST(SpecScale, ZeroSelectsOneOverSqrtHeadSize) {
  for (int head_size : {64, 80, 128}) {
    AttentionSpec s;
    s.head_size = head_size;
    s.scale = 0.0f;
    EXPECT_FLOAT_EQ(s.effective_scale(), static_cast<float>(1.0 / std::sqrt(double(head_size))));
    s.scale = 0.37f;
    EXPECT_EQ(s.effective_scale(), 0.37f);
  }
  // End to end: the executor's output with scale 0 matches the float64 reference computed with an
  // explicit 1/sqrt(64) = 0.125, and differs from it at scale 1 (so the scale reaches the logits).
  Rig rig;
  ASSERT_EQ(rig.cfg.spec.head_size, 64);
  rig.cfg.spec.scale = 0.0f;
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(7, 1, 1000);
  ex.step(in.view());
  rig.cfg.spec.scale = 0.125f;  // the rig's check runs the reference with this spec
  EXPECT_TRUE(rig.check_step(ex, in));
  rig.cfg.spec.scale = 1.0f;
  EXPECT_FALSE(rig.check_step(ex, in));
}

}  // namespace
}  // namespace dgrel
