// The version is set once (project(VERSION) in CMakeLists.txt): the generated header's macros, the
// library's version() and CHANGELOG.md must all carry it.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "decodegraph/version.hpp"

namespace {

TEST(Api, VersionHeaderAndLibraryAgreeWithTheProject) {
  const std::string project = DG_PROJECT_VERSION;  // from CMake, not from the header
  EXPECT_EQ(std::string(DECODEGRAPH_VERSION_STRING), project);
  EXPECT_EQ(std::string(decodegraph::version()), project);
  EXPECT_EQ(std::to_string(DECODEGRAPH_VERSION_MAJOR) + "." + std::to_string(DECODEGRAPH_VERSION_MINOR) + "." +
                std::to_string(DECODEGRAPH_VERSION_PATCH),
            project);
}

TEST(Api, VersionMatchesChangelog) {
  std::ifstream f(DG_CHANGELOG_PATH);
  ASSERT_TRUE(f) << "cannot open " << DG_CHANGELOG_PATH;
  std::stringstream text;
  text << f.rdbuf();
  const std::string heading = std::string("\n## [") + DG_PROJECT_VERSION + "]";
  EXPECT_NE(text.str().find(heading), std::string::npos)
      << "CHANGELOG.md has no section '## [" << DG_PROJECT_VERSION
      << "]' for the version in CMakeLists.txt's project(VERSION)";
}

}  // namespace
