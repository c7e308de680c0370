// Band choice in the host backend's graphs (BandSelect::kDevice; host_recording.hpp): the band-select
// node is a closure that runs kernels::select_band (the kernel's own __host__ __device__ math) on the
// staged lengths when the graph replays and stores the band in a cell the capture owns; each SWITCH
// node is a closure that runs the branch that cell names. Identical branches of a node share one
// recorded node list.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "decodegraph/error.hpp"
#include "executor/host_ops.hpp"
#include "executor/host_recording.hpp"
#include "kernels/band_select.cuh"

namespace decodegraph::detail {

void HostRecording::band_select(const kernels::BandSelectParams& params) {
  bound();
  if (!(capturing_ || recording_caller_) || switch_)
    throw Error("host band select (twin of the band-select kernel): record it in a capture, outside SWITCH nodes");
  auto cell = std::make_shared<int>(0);
  band_ = cell;
  // Only what the kernel reads is bound; the handle array is the CUDA backend's business.
  const int32_t* lens = params.seq_lens;
  const int batch = params.batch, num_edges = params.num_edges;
  const int* edges = params.edges;
  unsigned long long* counts = params.branch_counts;
  int* band_out = params.band_out;
  enqueue([=] {
    check_kernel("host band select (twin of BandSelectKernel)");
    const int band = kernels::select_band(kernels::longest_length(lens, batch), edges, num_edges);
    *cell = band;
    if (counts) counts[band] += 1;
    if (band_out) *band_out = band;
  });
}

void HostRecording::begin_switch(int branches) {
  if (!(capturing_ || recording_caller_) || switch_)
    throw Error("host SWITCH node (twin of cudaGraphAddNode): no capture, or one already open");
  if (!band_) throw Error("host SWITCH node (twin of cudaGraphAddNode): no band-select node before it in this capture");
  if (++switches_ > kernels::kMaxSwitchHandles)
    throw Error("host SWITCH node (twin of cudaGraphAddNode): more than " +
                std::to_string(kernels::kMaxSwitchHandles) + " in one graph");
  switch_ = std::make_unique<OpenSwitch>();
  switch_->branches.resize(static_cast<std::size_t>(branches));
  switch_->counts.assign(static_cast<std::size_t>(branches), 0);
}

bool HostRecording::begin_branch(int branch, int key) {
  if (!switch_ || branch < 0 || branch >= static_cast<int>(switch_->branches.size()) || switch_->branch >= 0)
    throw Error("host SWITCH branch: no open SWITCH node, a branch already open, or branch out of range");
  switch_->branch = branch;
  switch_->fresh = false;
  if (auto it = switch_->by_key.find(key); it != switch_->by_key.end()) {
    switch_->branches[branch] = switch_->branches[it->second];
    switch_->counts[branch] = switch_->counts[it->second];
    return false;
  }
  switch_->by_key.emplace(key, branch);
  switch_->branches[branch] = std::make_shared<std::vector<Node>>();
  saved_count_ = count_;
  switch_->fresh = true;
  return true;
}

void HostRecording::end_branch() {
  if (!switch_ || switch_->branch < 0) throw Error("host SWITCH branch end: no branch open");
  const int b = switch_->branch;
  if (switch_->fresh) {
    // What was recorded since begin_branch went into this branch (see enqueue(), host_recording.cpp).
    switch_->counts[b] = count_ - saved_count_;
    count_ = saved_count_;
  }
  switch_->branch = -1;
}

void HostRecording::end_switch() {
  if (!switch_ || switch_->branch >= 0) throw Error("host SWITCH node end: no SWITCH node open, or a branch still open");
  std::unique_ptr<OpenSwitch> sw = std::move(switch_);
  std::vector<std::shared_ptr<const std::vector<Node>>> branches(sw->branches.begin(), sw->branches.end());
  for (int c : sw->counts) count_ += c;  // CUDA clones a shared branch into each body: count each
  std::shared_ptr<const int> band = band_;
  push_top([band, branches] {
    const int b = *band;
    if (b < 0 || b >= static_cast<int>(branches.size())) return;  // as CUDA: no branch runs
    for (const Node& n : *branches[b]) n();
  });
}

}  // namespace decodegraph::detail
