// DG_CUDA_CHECK (kernels/cuda_check.hpp) on real cudaError_t values: which kind each becomes; the
// launch check against a pending error earlier work left behind, with a modelled cudaGetLastError;
// and the names graph instantiation's error text gives results and node types. Needs the CUDA
// headers and runtime library only (cudaGetErrorName needs no device), so it runs on CPU machines too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "graphs/graph.hpp"
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

// ---------------------------------------------------------------- pending errors and launch checks

// The runtime's per-thread last error, modelled: cudaGetLastError returns it and clears it, except a
// sticky one, which every later call returns.
cudaError_t g_last = cudaSuccess;
cudaError_t model_last_error() {
  return cuda_error_is_sticky(g_last) ? g_last : std::exchange(g_last, cudaSuccess);
}
using cuda_detail::check_launch;
using cuda_detail::take_pending_error;
using cuda_detail::throw_cuda_error;

// Why entry points take the pending error first: a check after the launch alone sees the leftover
// as the launch's own failure.
TEST(CudaLaunchCheck, ALeftoverErrorIsWhatAPlainCheckAfterTheLaunchSees) {
  g_last = cudaErrorNotReady;  // e.g. an event query whose answer nobody cleared
  try {
    check_launch<model_last_error>("PagedDecodeKernel", "f.cu", 1);
    ADD_FAILURE() << "the modelled leftover was not seen";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), cudaErrorNotReady);
  }
}

TEST(CudaLaunchCheck, ALeftoverIsTakenBeforeTheLaunchAndNotBlamedOnIt) {
  g_last = cudaErrorNotReady;
  EXPECT_EQ((take_pending_error<model_last_error>("paged_attention_v1", "f.cu", 1)), cudaErrorNotReady)
      << "the leftover is handed back, for the caller to report";
  EXPECT_EQ(g_last, cudaSuccess) << "and cleared";
  // the launch succeeds: nothing pending
  EXPECT_NO_THROW(check_launch<model_last_error>("PagedDecodeKernel", "f.cu", 2));
  EXPECT_EQ((take_pending_error<model_last_error>("append_kv", "f.cu", 3)), cudaSuccess) << "none pending";
}

TEST(CudaLaunchCheck, OurLaunchFailingAfterALeftoverReportsOurError) {
  g_last = cudaErrorInvalidValue;
  EXPECT_EQ((take_pending_error<model_last_error>("paged_attention_v2", "f.cu", 1)), cudaErrorInvalidValue);
  g_last = cudaErrorLaunchOutOfResources;  // the launch's own failure
  try {
    check_launch<model_last_error>("MergePartitionsKernel", "f.cu", 2);
    ADD_FAILURE() << "the launch's failure was not reported";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), cudaErrorLaunchOutOfResources);
    EXPECT_NE(std::string(e.what()).find("launch of MergePartitionsKernel failed: cudaErrorLaunchOutOfResources"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(g_last, cudaSuccess) << "reported, so not left pending for the next check";
}

TEST(CudaLaunchCheck, AStickyLeftoverThrowsBeforeTheLaunchAsLostContext) {
  g_last = cudaErrorIllegalAddress;
  try {
    (void)take_pending_error<model_last_error>("paged_attention_v1", "f.cu", 1);
    ADD_FAILURE() << "a sticky leftover was not thrown";
  } catch (const CudaError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), cudaErrorIllegalAddress);
    EXPECT_TRUE(e.context_lost());
    EXPECT_NE(msg.find("CUDA work before paged_attention_v1 (not decodegraph's) failed: cudaErrorIllegalAddress"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("context is lost"), std::string::npos) << msg;
  }
  g_last = cudaSuccess;
}

TEST(CudaLaunchCheck, AFailedCheckedCallIsNotLeftPending) {
  g_last = cudaErrorInvalidValue;  // as if the checked call had failed with it
  EXPECT_THROW(throw_cuda_error<model_last_error>(cudaErrorInvalidValue, "cudaMemcpyAsync(...)", "f.cpp", 1),
               CudaError);
  EXPECT_EQ(g_last, cudaSuccess);
  g_last = cudaErrorMemoryAllocation;
  EXPECT_THROW(throw_cuda_error<model_last_error>(cudaErrorMemoryAllocation, "cudaMalloc(...)", "f.cpp", 2),
               OutOfMemory);
  EXPECT_EQ(g_last, cudaSuccess);
}

// ---------------------------------------------------------------- instantiation's error text

TEST(GraphInstantiateText, NamesEveryResultOfTheHeaders) {
  const std::pair<cudaGraphInstantiateResult, const char*> results[] = {
      {cudaGraphInstantiateError, "cudaGraphInstantiateError"},
      {cudaGraphInstantiateInvalidStructure, "cudaGraphInstantiateInvalidStructure"},
      {cudaGraphInstantiateNodeOperationNotSupported, "cudaGraphInstantiateNodeOperationNotSupported"},
      {cudaGraphInstantiateMultipleDevicesNotSupported, "cudaGraphInstantiateMultipleDevicesNotSupported"},
      {cudaGraphInstantiateConditionalHandleUnused, "cudaGraphInstantiateConditionalHandleUnused"},
  };
  for (const auto& [r, name] : results) {
    const std::string text = graphs::instantiate_result_text(r);
    EXPECT_EQ(text.rfind(name, 0), 0u) << text;
  }
  EXPECT_EQ(graphs::instantiate_result_text(static_cast<cudaGraphInstantiateResult>(77)),
            "result 77 (unknown to this build)");
}

TEST(GraphInstantiateText, NamesEveryNodeTypeOfTheHeaders) {
  const std::pair<cudaGraphNodeType, const char*> types[] = {
      {cudaGraphNodeTypeKernel, "cudaGraphNodeTypeKernel = 0)"},
      {cudaGraphNodeTypeMemcpy, "cudaGraphNodeTypeMemcpy = 1)"},
      {cudaGraphNodeTypeMemset, "cudaGraphNodeTypeMemset = 2)"},
      {cudaGraphNodeTypeHost, "cudaGraphNodeTypeHost = 3)"},
      {cudaGraphNodeTypeGraph, "cudaGraphNodeTypeGraph = 4)"},
      {cudaGraphNodeTypeEmpty, "cudaGraphNodeTypeEmpty = 5)"},
      {cudaGraphNodeTypeWaitEvent, "cudaGraphNodeTypeWaitEvent = 6)"},
      {cudaGraphNodeTypeEventRecord, "cudaGraphNodeTypeEventRecord = 7)"},
      {cudaGraphNodeTypeExtSemaphoreSignal, "cudaGraphNodeTypeExtSemaphoreSignal = 8)"},
      {cudaGraphNodeTypeExtSemaphoreWait, "cudaGraphNodeTypeExtSemaphoreWait = 9)"},
      {cudaGraphNodeTypeMemAlloc, "cudaGraphNodeTypeMemAlloc = 10)"},
      {cudaGraphNodeTypeMemFree, "cudaGraphNodeTypeMemFree = 11)"},
      {cudaGraphNodeTypeConditional, "cudaGraphNodeTypeConditional = 13)"},
  };
  for (const auto& [t, name] : types) {
    const std::string text = graphs::node_type_text(t);
    EXPECT_NE(text.find(std::string("(") + name), std::string::npos) << text;
  }
  EXPECT_EQ(graphs::node_type_text(cudaGraphNodeTypeConditional), "conditional node (cudaGraphNodeTypeConditional = 13)");
  EXPECT_EQ(graphs::node_type_text(static_cast<cudaGraphNodeType>(12)), "node of unknown type 12");
}

}  // namespace
