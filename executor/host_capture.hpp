// The host backend's model of a caller's stream capture (internal; tests and tools): what an engine
// that captures its whole forward pass does with cudaStreamBeginCapture on its own stream, on the CPU.
//
// A HostStreamCapture is a stream handle (stream()) that is "being captured" from construction to
// end(). A step() on the host backend given that stream records its work into the capture instead of
// running it, exactly as the CUDA backend records into a real caller's capture: the staging copies
// from the caller's (device-space) input buffers, the band-select node and SWITCH nodes, every layer's
// append and attention, the bad-block flag copy. record() adds the caller's own work in stream order
// (its QKV GEMM, say); replay() reruns everything, as a launch of the caller's instantiated graph
// would, reading whatever the bound buffers hold then.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "decodegraph/types.hpp"

namespace decodegraph::detail {

class HostStreamCapture {
 public:
  HostStreamCapture();  // begins the capture
  ~HostStreamCapture();
  HostStreamCapture(const HostStreamCapture&) = delete;
  HostStreamCapture& operator=(const HostStreamCapture&) = delete;

  /// The captured stream: pass it to Executor::step (host backend).
  Stream stream() const;
  bool capturing() const { return capturing_; }
  /// The caller's own work, recorded after what is recorded so far (throws Error after end()).
  void record(std::function<void()> fn);
  /// Ends the capture: the recording is the caller's graph from now on.
  void end();
  /// Runs the recording once (throws Error while still capturing, as cudaGraphLaunch of an
  /// unfinished capture cannot be).
  void replay() const;
  int nodes() const { return static_cast<int>(nodes_.size()); }

  /// The capture `s` names, if it is a HostStreamCapture still capturing; else null (internal: the
  /// host backend's begin_step).
  static HostStreamCapture* find(Stream s);

 private:
  std::vector<std::function<void()>> nodes_;
  bool capturing_ = true;
};

}  // namespace decodegraph::detail
