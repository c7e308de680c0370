// The validation default does not depend on the consumer's NDEBUG: two translation units of this one
// program, one compiled with NDEBUG and one without (tests/api/CMakeLists.txt), see the same
// kDefaultValidation, build the same ExecutorConfig{} and get the same level from an Executor. It
// used to be an #ifdef NDEBUG constant in executor.hpp, so these two files disagreed.
#include <gtest/gtest.h>

#include "decodegraph/executor.hpp"
#include "validation_default_tu.hpp"

namespace {

using decodegraph::ValidationLevel;

TEST(ValidationDefault, IsKCheapWhateverTheIncludingFilesNdebug) {
  const dgtest::ValidationSeen with = dgtest::validation_seen_with_ndebug();
  const dgtest::ValidationSeen without = dgtest::validation_seen_without_ndebug();
  ASSERT_TRUE(with.ndebug);
  ASSERT_FALSE(without.ndebug);
  EXPECT_EQ(with.constant, without.constant) << "kDefaultValidation differs between the two files";
  EXPECT_EQ(with.field, without.field) << "ExecutorConfig{}.validation differs between the two files";
  EXPECT_EQ(with.resolved, without.resolved) << "the executors of the two files validate differently";
  for (const dgtest::ValidationSeen& s : {with, without}) {
    EXPECT_EQ(s.constant, ValidationLevel::kCheap);
    EXPECT_EQ(s.field, ValidationLevel::kCheap);
    EXPECT_EQ(s.resolved, ValidationLevel::kCheap);
  }
}

}  // namespace
