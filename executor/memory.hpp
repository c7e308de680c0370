// Executor memory (internal): every buffer an executor allocates, freed with it, and the byte counts
// that the memory budget and MemoryReport are made of.
#pragma once

#include <cstddef>
#include <vector>

#include "executor/backend.hpp"

namespace decodegraph::detail {

/// Owns executor allocations (device memory on CUDA, host memory on the host backend) and pinned
/// host staging memory. The backend must outlive it.
class Allocations {
 public:
  explicit Allocations(Backend& backend) : backend_(backend) {}
  ~Allocations() {
    for (const Owned& o : owned_) o.host ? backend_.free_host(o.p) : backend_.free(o.p);
  }
  Allocations(const Allocations&) = delete;
  Allocations& operator=(const Allocations&) = delete;

  /// Zero-initialised executor memory (Backend::alloc). Throws OutOfMemory; nothing leaks.
  void* device(std::size_t bytes) { return keep(backend_.alloc(bytes), false); }
  /// Pinned host memory (Backend::alloc_host), not zeroed on CUDA.
  void* host(std::size_t bytes) { return keep(backend_.alloc_host(bytes), true); }

 private:
  struct Owned {
    void* p;
    bool host;
  };
  void* keep(void* p, bool host) {
    try {
      owned_.push_back(Owned{p, host});
    } catch (...) {
      host ? backend_.free_host(p) : backend_.free(p);
      throw;
    }
    return p;
  }
  Backend& backend_;
  std::vector<Owned> owned_;
};

/// What the memory budget is checked against (ExecutorConfig::memory_budget_bytes; graph memory is
/// the graph cache's to add).
struct MemoryLedger {
  std::size_t budget = 0;           // 0 = unlimited
  std::size_t static_bytes = 0;     // staged inputs, owned layer buffers, ALiBi, flags, counters
  std::size_t workspace_bytes = 0;  // V2 partials: the largest plan or kMeasured candidate
};

}  // namespace decodegraph::detail
