// DG_CUDA_CHECK (kernels/cuda_check.hpp) on real cudaError_t values: which kind each becomes. Needs
// the CUDA headers and runtime library only (cudaGetErrorName needs no device), so it runs on CPU
// machines too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda_check.hpp"

namespace {

using namespace decodegraph;

cudaError_t returns(cudaError_t e) { return e; }

TEST(CudaCheck, MemoryAllocationIsOutOfMemory) {
  try {
    DG_CUDA_CHECK(returns(cudaErrorMemoryAllocation));
    ADD_FAILURE() << "nothing thrown";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("cudaErrorMemoryAllocation"), std::string::npos) << e.what();
  }
}

TEST(CudaCheck, StickyErrorsSayTheContextIsLost) {
  for (cudaError_t err : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert,
                          cudaErrorMisalignedAddress}) {
    try {
      DG_CUDA_CHECK(returns(err));
      ADD_FAILURE() << "nothing thrown for " << cudaGetErrorName(err);
    } catch (const CudaError& e) {
      EXPECT_EQ(e.code(), static_cast<int>(err));
      EXPECT_TRUE(e.context_lost()) << e.what();
      EXPECT_NE(std::string(e.what()).find(cudaGetErrorName(err)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("context is lost"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaCheck, OtherErrorsAreRecoverableCudaErrors) {
  for (cudaError_t err : {cudaErrorInvalidValue, cudaErrorNoDevice, cudaErrorLaunchOutOfResources,
                          cudaErrorStreamCaptureInvalidated}) {
    try {
      DG_CUDA_CHECK(returns(err));
      ADD_FAILURE() << "nothing thrown for " << cudaGetErrorName(err);
    } catch (const CudaError& e) {
      EXPECT_EQ(e.code(), static_cast<int>(err));
      EXPECT_FALSE(e.context_lost()) << e.what();
    }
  }
}

}  // namespace
