// The host backend's recording (host_recording.hpp): the step's stream, captures, graphs and their
// replay. Streams do not exist here: every step runs inside step(), so a caller's stream is accepted
// and ignored, unless it is a HostStreamCapture's, whose capture then receives the step's work.
#include "executor/host_recording.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"

namespace decodegraph::detail {
namespace {

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

class HostCaptured final : public CapturedGraph {
 public:
  HostCaptured(std::vector<Node> n, int count) : nodes(std::move(n)), node_count(count) {}
  std::vector<Node> nodes;
  int node_count = 0;  // every node, branches included (identical branches counted per branch)
};

class HostGraph final : public BackendGraph {
 public:
  HostGraph(std::vector<Node> nodes, int count) : nodes_(std::move(nodes)), count_(count) {}
  int nodes() const override { return count_; }
  std::size_t bytes() const override { return 0; }
  void run() const {
    for (const Node& n : nodes_) n();
  }
  void replace(std::vector<Node> nodes, int count) {
    nodes_ = std::move(nodes);
    count_ = count;
  }

 private:
  std::vector<Node> nodes_;
  int count_ = 0;
};

}  // namespace

// ------------------------------------------------------------ the step's stream

void HostRecording::begin_step(std::optional<Stream> s) {
  bound();
  caller_ = s ? HostStreamCapture::find(*s) : nullptr;
}

void HostRecording::end_step() noexcept {
  caller_ = nullptr;
  recording_caller_ = false;
}

// ------------------------------------------------------------ graphs

void HostRecording::begin_capture() {
  bound();
  if (recording_caller_) throw Error("host capture begin (twin of cudaStreamBeginCapture) failed: recording into a caller's capture");
  if (capturing_) throw Error("host capture begin (twin of cudaStreamBeginCapture) failed: a capture is already active");
  if (fault::should_fail(fault::Site::kCaptureBegin))
    injected("host capture begin (twin of cudaStreamBeginCapture)", fault::Site::kCaptureBegin);
  reset_capture();
  capturing_ = true;
}

std::unique_ptr<CapturedGraph> HostRecording::end_capture() {
  bound();
  if (!capturing_) throw Error("host capture end (twin of cudaStreamEndCapture) failed: no capture is active");
  capturing_ = false;
  const bool open_switch = switch_ != nullptr;
  std::vector<Node> nodes = std::move(recorded_);
  const int count = count_;
  reset_capture();
  if (open_switch) throw Error("host capture end (twin of cudaStreamEndCapture) failed: a SWITCH node is still open");
  if (fault::should_fail(fault::Site::kCaptureEnd))
    injected("host capture end (twin of cudaStreamEndCapture)", fault::Site::kCaptureEnd);
  return std::make_unique<HostCaptured>(std::move(nodes), count);
}

std::unique_ptr<BackendGraph> HostRecording::instantiate(CapturedGraph& captured) {
  bound();
  if (fault::should_fail(fault::Site::kInstantiate))
    injected("host instantiate (twin of cudaGraphInstantiate)", fault::Site::kInstantiate);
  auto& c = static_cast<HostCaptured&>(captured);
  return std::make_unique<HostGraph>(std::move(c.nodes), c.node_count);
}

bool HostRecording::update(BackendGraph& exec, CapturedGraph& captured) {
  // An update that fails falls back to re-instantiation, as on CUDA; for host graphs both amount
  // to swapping the node list, so only the instantiate fault can make this throw.
  bound();
  const bool refused = fault::should_fail(fault::Site::kGraphUpdate);
  if (refused && fault::should_fail(fault::Site::kInstantiate))
    injected("host instantiate (twin of cudaGraphInstantiate, after a failed update)", fault::Site::kInstantiate);
  auto& c = static_cast<HostCaptured&>(captured);
  static_cast<HostGraph&>(exec).replace(std::move(c.nodes), c.node_count);
  return !refused;
}

void HostRecording::abort_capture() noexcept {
  capturing_ = false;
  recording_caller_ = false;
  reset_capture();
}

void HostRecording::begin_caller_capture() {
  bound();
  if (!caller_ || capturing_ || recording_caller_)
    throw Error("host caller capture (twin of recording into a stream capture): the step's stream is not being captured, or a capture is open");
  reset_capture();
  recording_caller_ = true;
}

void HostRecording::end_caller_capture() {
  bound();
  if (!recording_caller_) throw Error("host caller capture end: none open");
  recording_caller_ = false;
  const bool open_switch = switch_ != nullptr;
  reset_capture();
  if (open_switch) throw Error("host caller capture end: a SWITCH node is still open");
}

void HostRecording::launch(BackendGraph& g) {
  bound();
  if (capturing_ || caller_) throw Error("host graph launch (twin of cudaGraphLaunch) failed: called during a capture");
  if (fault::should_fail(fault::Site::kGraphLaunch))
    injected("host graph launch (twin of cudaGraphLaunch)", fault::Site::kGraphLaunch);
  static_cast<HostGraph&>(g).run();
}

double HostRecording::time_replays(BackendGraph& g, int replays) {
  if (caller_) throw Error("kMeasured timing refused: the step's stream is being captured");
  launch(g);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < replays; ++i) launch(g);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         std::max(replays, 1);
}

// ------------------------------------------------------------ where an op goes

// Outside a capture an op runs at once (eager); inside, it is recorded, into the open branch of a
// SWITCH node when there is one. On a caller's captured stream it goes into that capture.
void HostRecording::enqueue(Node n) {
  bound();
  if (!capturing_ && !recording_caller_) {
    if (caller_) return caller_->record(std::move(n));
    n();
    return;
  }
  if (switch_ && switch_->branch >= 0) {
    switch_->branches[switch_->branch]->push_back(std::move(n));
    ++count_;
  } else {
    push_top(std::move(n));
  }
}

// The top level of the capture being recorded: ours, or the caller's.
void HostRecording::push_top(Node n) {
  if (capturing_)
    recorded_.push_back(std::move(n));
  else
    caller_->record(std::move(n));
  ++count_;
}

void HostRecording::reset_capture() noexcept {
  recorded_.clear();
  switch_.reset();
  band_.reset();
  count_ = saved_count_ = switches_ = 0;
}

}  // namespace decodegraph::detail
