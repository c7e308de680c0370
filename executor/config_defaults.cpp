// ExecutorConfig's vocabulary: the names its enums print as (and parse_kernel_policy reads back),
// and the default band edges and batch buckets that resolve_planning fills in where the caller
// gives none (docs/integration.md's table of ExecutorConfig fields).
#include <algorithm>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/executor.hpp"

namespace decodegraph {

const char* to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kCuda: return "cuda";
    case BackendKind::kHost: return "host";
  }
  return "unknown";
}

const char* to_string(CapturePolicy policy) {
  switch (policy) {
    case CapturePolicy::kUpFront: return "up_front";
    case CapturePolicy::kLazy: return "lazy";
  }
  return "unknown";
}

const char* to_string(KernelPolicy policy) {
  switch (policy) {
    case KernelPolicy::kAuto: return "auto";
    case KernelPolicy::kThreshold: return "threshold";
    case KernelPolicy::kMeasured: return "measured";
  }
  return "unknown";
}

const char* to_string(BandSelect mode) {
  switch (mode) {
    case BandSelect::kHost: return "host";
    case BandSelect::kDevice: return "device";
  }
  return "unknown";
}

KernelPolicy parse_kernel_policy(const std::string& name) {
  if (name == "auto") return KernelPolicy::kAuto;
  if (name == "threshold") return KernelPolicy::kThreshold;
  if (name == "measured") return KernelPolicy::kMeasured;
  throw_invalid("policy", '"' + name + '"', "auto, threshold, measured");
}

std::vector<int> default_band_edges(int max_seq_len, int v2_threshold) {
  std::vector<int> edges;
  for (long long e = 512; e < max_seq_len; e *= 2) edges.push_back(static_cast<int>(e));
  if (v2_threshold > 0 && v2_threshold < max_seq_len) edges.push_back(v2_threshold);
  if (max_seq_len > 0) edges.push_back(max_seq_len);
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  return edges;
}

std::vector<int> default_batch_buckets(int max_batch) {
  std::vector<int> b;
  for (int v : {1, 2, 4, 8})
    if (v < max_batch) b.push_back(v);
  for (int v = 16; v <= 256 && v < max_batch; v += 8) b.push_back(v);
  for (int v = 272; v < max_batch; v += 16) b.push_back(v);
  if (max_batch > 0) b.push_back(max_batch);
  return b;
}

}  // namespace decodegraph
