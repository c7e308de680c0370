// Fault-injection seam (include/decodegraph/fault.hpp). The unarmed path is one relaxed atomic
// load of a bit mask; arming, disarming and consuming an armed failure take a mutex, so tests may
// arm from one thread while the library runs on another.
#include "decodegraph/fault.hpp"

#include <array>
#include <atomic>
#include <mutex>

#include "decodegraph/error.hpp"

namespace decodegraph::fault {
namespace {

constexpr int kSites = static_cast<int>(Site::kCount);

struct SiteState {
  int skip = 0;   // calls still to let pass
  int count = 0;  // failures still to inject
  int fired = 0;  // failures injected since the last disarm
};

std::atomic<unsigned> g_armed_mask{0};  // bit i set while site i has failures left to inject
std::mutex g_mutex;
std::array<SiteState, kSites> g_sites{};

unsigned bit(Site s) { return 1u << static_cast<unsigned>(s); }
bool valid(Site s) { return static_cast<int>(s) >= 0 && static_cast<int>(s) < kSites; }

}  // namespace

const char* to_string(Site site) {
  switch (site) {
    case Site::kAlloc: return "alloc";
    case Site::kMemcpy: return "memcpy";
    case Site::kCaptureBegin: return "capture_begin";
    case Site::kCaptureEnd: return "capture_end";
    case Site::kInstantiate: return "instantiate";
    case Site::kGraphUpdate: return "graph_update";
    case Site::kGraphLaunch: return "graph_launch";
    case Site::kKernelLaunch: return "kernel_launch";
    case Site::kCount: break;
  }
  return "unknown";
}

void arm(Site site, int skip, int count) {
  if (!valid(site)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  SiteState& s = g_sites[static_cast<int>(site)];
  s.skip = skip < 0 ? 0 : skip;
  s.count = count < 0 ? 0 : count;
  s.fired = 0;
  if (s.count > 0)
    g_armed_mask.fetch_or(bit(site), std::memory_order_relaxed);
  else
    g_armed_mask.fetch_and(~bit(site), std::memory_order_relaxed);
}

void disarm(Site site) {
  if (!valid(site)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sites[static_cast<int>(site)] = SiteState{};
  g_armed_mask.fetch_and(~bit(site), std::memory_order_relaxed);
}

void disarm_all() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sites.fill(SiteState{});
  g_armed_mask.store(0, std::memory_order_relaxed);
}

int fired(Site site) {
  if (!valid(site)) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_sites[static_cast<int>(site)].fired;
}

bool should_fail(Site site) {
  // Fast path: nothing armed anywhere (the production case).
  if (!valid(site) || (g_armed_mask.load(std::memory_order_relaxed) & bit(site)) == 0) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  SiteState& s = g_sites[static_cast<int>(site)];
  if (s.count <= 0) return false;
  if (s.skip > 0) {
    --s.skip;
    return false;
  }
  --s.count;
  ++s.fired;
  // fired stays readable after the last failure; only the mask bit goes.
  if (s.count == 0) g_armed_mask.fetch_and(~bit(site), std::memory_order_relaxed);
  return true;
}

void throw_injected(Site site, const std::string& call) {
  const std::string msg = call + " failed: injected fault (site " + to_string(site) + ")";
  if (site == Site::kAlloc) throw OutOfMemory(msg);
  throw CudaError(msg, kInjectedFaultCode);
}

}  // namespace decodegraph::fault
