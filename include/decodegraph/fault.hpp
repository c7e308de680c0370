// Fault injection seam (for tests): makes a chosen CUDA call, or its host-backend twin, fail.
// Library code calls should_fail(site) right before the real call; when it returns true the call is
// treated as failed with the site's name in the Error. Cheap (one relaxed atomic load) when unarmed.
// An injected failure throws what a real failure of that call most often is, on either backend:
// OutOfMemory at kAlloc; at every other site a CudaError with code() == kInjectedFaultCode
// (cudaErrorUnknown) and context_lost() == false, so the executor stays usable, as it must after
// any recoverable CUDA error.
#pragma once

#include <string>

namespace decodegraph::fault {

enum class Site : int {
  kAlloc = 0,         // cudaMalloc / host allocation of executor memory
  kMemcpy,            // staging copies
  kCaptureBegin,      // cudaStreamBeginCapture
  kCaptureEnd,        // cudaStreamEndCapture
  kInstantiate,       // cudaGraphInstantiate
  kGraphUpdate,       // cudaGraphExecUpdate
  kGraphLaunch,       // cudaGraphLaunch / host replay
  kKernelLaunch,      // any kernel launch (checked with cudaGetLastError)
  kCount
};

const char* to_string(Site site);

/// Lets `skip` calls at `site` pass, then fails the next `count` ones.
void arm(Site site, int skip = 0, int count = 1);
void disarm(Site site);
void disarm_all();
/// How many injected failures fired at `site` since the last disarm.
int fired(Site site);
/// Library side: consumes one armed failure at `site` if any.
bool should_fail(Site site);
/// Library side: throws the injected failure of `call` at `site` (see the top of this file).
[[noreturn]] void throw_injected(Site site, const std::string& call);

/// Arms in the constructor, disarms everything in the destructor.
class ScopedFault {
 public:
  ScopedFault(Site site, int skip = 0, int count = 1) { arm(site, skip, count); }
  ~ScopedFault() { disarm_all(); }
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;
};

}  // namespace decodegraph::fault
