// The host backend's model of a caller's stream capture (host_capture.hpp).
#include "executor/host_capture.hpp"

#include <algorithm>
#include <mutex>
#include <utility>

#include "decodegraph/error.hpp"

namespace decodegraph::detail {
namespace {

// The captures in progress: a Stream is looked up here, never dereferenced, since any pointer
// (a real cudaStream_t, garbage) may be passed as one.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<const HostStreamCapture*>& registry() {
  static std::vector<const HostStreamCapture*> r;
  return r;
}

void unregister(const HostStreamCapture* c) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), c), r.end());
}

}  // namespace

HostStreamCapture::HostStreamCapture() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().push_back(this);
}

HostStreamCapture::~HostStreamCapture() { unregister(this); }

Stream HostStreamCapture::stream() const { return reinterpret_cast<Stream>(const_cast<HostStreamCapture*>(this)); }

void HostStreamCapture::record(std::function<void()> fn) {
  if (!capturing_) throw Error("host stream capture: record() after end()");
  nodes_.push_back(std::move(fn));
}

void HostStreamCapture::end() {
  capturing_ = false;
  unregister(this);
}

void HostStreamCapture::replay() const {
  if (capturing_) throw Error("host stream capture: replay() before end() (twin of launching an unfinished capture)");
  for (const auto& n : nodes_) n();
}

HostStreamCapture* HostStreamCapture::find(Stream s) {
  if (!s) return nullptr;
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const HostStreamCapture* c : registry())
    if (c->stream() == s) return const_cast<HostStreamCapture*>(c);
  return nullptr;
}

}  // namespace decodegraph::detail
