// Builds without CUDA: the GPU kernel suite exists and says why it did not run.
#include <gtest/gtest.h>

#include "test_util.hpp"  // SkipRecorder: ctest prints the reason below

TEST(GpuKernels, AllSkipped) { GTEST_SKIP() << "built without CUDA: GPU kernel tests not run"; }
