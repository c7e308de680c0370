// The CUDA backend (internal to executor/cuda/): one Backend, CudaBackend, whose state (streams,
// events, the capture in progress) its parts share, so its members are defined by responsibility
// in several files, each opening with what its part relies upon:
//   cuda_backend.cpp   construction, the device, the step's stream and how steps are ordered, the ops
//   cuda_memory.cpp    executor memory, pinned mirrors, uploads, downloads, the staging copies
//   cuda_capture.cpp   captures of our stream or the caller's, instantiation, update, launch, timing
//   cuda_switch.cpp    band choice in the graph: the band-select node and the SWITCH nodes
//   switch_probe.cpp   whether this driver and runtime run SWITCH nodes the way capture builds them
// and DriverAddressRanges (address_ranges.hpp) asks the driver where caller buffers end.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "executor/backend.hpp"
#include "executor/cuda/address_ranges.hpp"
#include "graphs/graph.hpp"
#include "kernels/band_select.cuh"

namespace decodegraph::detail {

/// Logs an error earlier CUDA work on this thread left pending, found (and cleared) before `before`.
void log_leftover(cudaError_t err, const char* before);

class CudaBackend final : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::kCuda; }
  Stream stream() const override { return stream_; }
  DeviceModel device_model(const AttentionSpec& spec) const override;

  // ------------------------------------------------------------ the executor's device
  int enter_device() override;
  void leave_device(int previous) noexcept override;

  // ------------------------------------------------------------ memory and copies (cuda_memory.cpp)
  void* alloc(std::size_t bytes) override;
  void free(void* p) noexcept override;
  void* alloc_host(std::size_t bytes) override;
  void free_host(void* p) noexcept override;
  void upload(void* dst, const void* src, std::size_t bytes) override;
  void download(void* dst, const void* src, std::size_t bytes, MemorySpace space) override;
  void stage_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                std::size_t rows, MemorySpace space) override;
  void stage_fill(void* dst, int byte, std::size_t bytes) override;
  void wait_staging_reusable(int slot) override;
  void staging_done(int slot) override;
  bool staging_reusable_now(int slot) override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  bool read_for_stats(void* dst, const void* src, std::size_t bytes) noexcept override;
  AddressRange address_range(const void* p) const override { return ranges_.address_range(p); }

  // ------------------------------------------------------------ the step's stream
  void begin_step(std::optional<Stream> s) override;
  void end_step() noexcept override;
  bool in_caller_capture() const override { return caller_; }
  void wait_last_step() override;

  // ------------------------------------------------------------ graphs (cuda_capture.cpp)
  void begin_capture() override;
  std::unique_ptr<CapturedGraph> end_capture() override;
  std::unique_ptr<BackendGraph> instantiate(CapturedGraph& captured) override;
  bool update(BackendGraph& exec, CapturedGraph& captured) override;
  void abort_capture() noexcept override;
  void begin_caller_capture() override;
  void end_caller_capture() override;
  Stream capture_stream() const override { return top(); }
  void launch(BackendGraph& g) override;
  double time_replays(BackendGraph& g, int replays) override;

  // ------------------------------------------------------------ ops
  void attention_v1(const DecodeArgs& args) override;
  void attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                    std::size_t workspace_bytes) override;
  void append(const AppendArgs& args) override;
  void host_work(std::function<void()>) override;

  // ------------------------------------------------------------ SWITCH nodes (cuda_switch.cpp)
  bool switch_supported(std::string& why) override;  // switch_probe.cpp
  bool programmatic_launch_supported(std::string& why) const override;
  void band_select(const kernels::BandSelectParams& p) override;
  void begin_switch(int branches) override;
  bool begin_branch(int branch, int key) override;
  void end_branch() override;
  void end_switch() override;

 private:
  graphs::Graph take_graph();
  static void clear_leftover(const char* before);
  // Whether a launch on `s` may be programmatic (cuda_backend.cpp, "Programmatic dependent launch").
  bool after_kernel_nodes(cudaStream_t s) const;
  // The top level of the capture being recorded: ours on the own stream, or the caller's.
  cudaStream_t top() const { return recording_caller_ ? cur_ : stream_; }
  // The stream ops are recorded on: the branch stream while a SWITCH branch is being captured.
  cudaStream_t rec() const { return sw_.active && sw_.fresh ? branch_stream_ : top(); }
  static void set_band_select_handles(cudaGraphNode_t node, kernels::BandSelectParams params);
  void upload_graph(const graphs::GraphExec& e);
  int bind_noexcept() noexcept;
  void reset_switch_state() noexcept;
  void drain() noexcept;
  void destroy() noexcept;

  int device_ = 0;
  int sms_ = 0;
  int cc_major_ = 0, cc_minor_ = 0;  // compute capability, queried once (PDL needs 9.0)
  cudaStream_t stream_ = nullptr;
  cudaStream_t cur_ = nullptr;   // the running step's stream (stream_ between steps)
  cudaStream_t last_ = nullptr;  // the last finished step's stream; done_ marks its end unless it is stream_
  cudaEvent_t staged_[kStagingSlots] = {};  // per pinned mirror slot: its last staging copies
  cudaEvent_t done_ = nullptr;
  bool caller_ = false;            // the running step's stream is being captured by the caller
  bool recording_caller_ = false;  // begin_caller_capture .. end_caller_capture
  DriverAddressRanges ranges_;
  cudaEvent_t timing_[2] = {nullptr, nullptr};  // kMeasured: around the timed replays
  std::optional<graphs::CaptureScope> scope_;

  // kDevice capture state (reset when a capture ends or is aborted).
  struct BandSelectNode {
    cudaGraphNode_t node = nullptr;
    kernels::BandSelectParams params;
  };
  struct OpenSwitch {
    bool active = false;
    std::vector<cudaGraph_t> bodies;  // owned by the SWITCH node
    std::map<int, int> by_key;        // branch key -> the first branch recorded with it
    int branch = -1;
    bool fresh = false;               // the open branch is being captured on branch_stream_
  };
  cudaStream_t branch_stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;  // the graph being captured (cudaStreamGetCaptureInfo)
  BandSelectNode bs_;
  OpenSwitch sw_;
  int branch_nodes_ = 0;
};

}  // namespace decodegraph::detail
