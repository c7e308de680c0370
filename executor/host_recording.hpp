// The host backend's recording (internal): where an op goes, and what a capture makes of it.
//
// "Capture" records each op as a closure with its arguments bound by value (pointers included);
// "instantiate" freezes the list; "launch" reruns it. A value the caller changes after capture is
// therefore not seen unless it lives in a staged buffer (whose address is what got bound), exactly
// as with a CUDA graph. Outside a capture an op runs at once (eager).
//
// A caller's stream capture (host_capture.hpp): a step given a HostStreamCapture's stream records
// its staging copies and its graph's work into that capture instead of running them.
//
// Band choice in the graph (BandSelect::kDevice) is host_switch.cpp's part of this class: the
// band-select node and the SWITCH nodes, recorded into the same node lists.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "executor/backend.hpp"
#include "executor/device_guard.hpp"
#include "executor/host_capture.hpp"
#include "kernels/band_select.cuh"

namespace decodegraph::detail {

using Node = std::function<void()>;

/// The Backend operations of the step's stream, the graphs and band choice, on the host. Those
/// that count whether they ran with no device guard open count in `guard`, the backend's.
class HostRecording {
 public:
  explicit HostRecording(const HostDeviceDepth& guard) : guard_(guard) {}

  // ------------------------------------------------------------ the step's stream
  void begin_step(std::optional<Stream> s);
  void end_step() noexcept;
  bool in_caller_capture() const { return caller_ != nullptr; }
  /// The caller's capture the running step records into (its stream is being captured), or null.
  HostStreamCapture* caller() const { return caller_; }

  // ------------------------------------------------------------ graphs (host_recording.cpp)
  void begin_capture();
  std::unique_ptr<CapturedGraph> end_capture();
  std::unique_ptr<BackendGraph> instantiate(CapturedGraph& captured);
  bool update(BackendGraph& exec, CapturedGraph& captured);
  void abort_capture() noexcept;
  void begin_caller_capture();
  void end_caller_capture();
  Stream capture_stream() const { return recording_caller_ ? caller_->stream() : nullptr; }
  void launch(BackendGraph& g);
  double time_replays(BackendGraph& g, int replays);

  // ------------------------------------------------------------ band choice (host_switch.cpp)
  void band_select(const kernels::BandSelectParams& params);
  void begin_switch(int branches);
  bool begin_branch(int branch, int key);
  void end_branch();
  void end_switch();

  /// Runs `n` now, or records it where the step's work goes (host_recording.cpp).
  void enqueue(Node n);

 private:
  void push_top(Node n);
  void bound() const { guard_.bound(); }
  void reset_capture() noexcept;

  struct OpenSwitch {
    std::vector<std::shared_ptr<std::vector<Node>>> branches;
    std::vector<int> counts;       // nodes of each branch
    std::map<int, int> by_key;     // branch key -> the first branch recorded with it
    int branch = -1;               // the branch being recorded
    bool fresh = false;            // ... and it is recorded anew (not a reused one)
  };

  const HostDeviceDepth& guard_;
  bool capturing_ = false;
  HostStreamCapture* caller_ = nullptr;  // the step's stream is this caller's capture
  bool recording_caller_ = false;        // begin_caller_capture .. end_caller_capture
  std::vector<Node> recorded_;
  int count_ = 0, saved_count_ = 0, switches_ = 0;
  std::shared_ptr<int> band_;  // the capture's band-select cell
  std::unique_ptr<OpenSwitch> switch_;
};

}  // namespace decodegraph::detail
