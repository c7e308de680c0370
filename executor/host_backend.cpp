// Host backend: the executor's graph semantics on the CPU. This file is the Backend itself: executor
// memory is plain host memory at fixed addresses for the executor's lifetime, and the staging copies
// are memcpy and memset, run at once (or, on a step whose stream is a caller's capture, recorded as
// nodes of that capture: they read their source when it replays). Where each op goes (at once, into
// a capture, into a SWITCH branch) and what captures and graphs are is HostRecording's
// (host_recording.hpp, host_switch.cpp); what each op computes is host_ops.cpp's.
//
// The device guard: enter_device/leave_device only count (device_guard.hpp); each operation counts
// whether it ran with none open, which tests read to check that every entry point binds the device.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "executor/backend.hpp"
#include "executor/device_guard.hpp"
#include "executor/host_capture.hpp"
#include "executor/host_ops.hpp"
#include "executor/host_recording.hpp"
#include "executor/staging_ring.hpp"

namespace decodegraph::detail {
namespace {

constexpr std::size_t kAlign = 256;

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

class HostBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kHost; }
  Stream stream() const override { return nullptr; }
  DeviceModel device_model(const AttentionSpec& spec) const override {
    bound();
    return host_device_model(spec);
  }
  int enter_device() override {
    guard_.enter();
    return 0;
  }
  void leave_device(int) noexcept override { guard_.leave(); }

  void* alloc(std::size_t bytes) override { return alloc_zeroed(bytes, "host alloc (twin of cudaMalloc)"); }
  void free(void* p) noexcept override {
    bound();
    std::free(p);
  }
  void* alloc_host(std::size_t bytes) override {
    return alloc_zeroed(bytes, "host alloc (twin of cudaMallocHost)");
  }
  void free_host(void* p) noexcept override {
    bound();
    std::free(p);
  }

  void upload(void* dst, const void* src, std::size_t bytes) override {
    bound();
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memcpy (twin of cudaMemcpy)", fault::Site::kMemcpy);
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes, MemorySpace) override {
    // Host backend: "device" inputs are host memory too.
    bound();
    if (rec_.in_caller_capture())
      throw Error("host memcpy (twin of a synchronous cudaMemcpy) refused: the step's stream is being captured");
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memcpy (twin of cudaMemcpy)", fault::Site::kMemcpy);
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void stage_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                std::size_t rows, MemorySpace) override {
    bound();
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memcpy (twin of cudaMemcpy2DAsync)", fault::Site::kMemcpy);
    if (width == 0) return;
    auto copy = [d = static_cast<char*>(dst), s = static_cast<const char*>(src), dpitch, spitch, width, rows] {
      if (dpitch == width && spitch == width) {
        std::memcpy(d, s, width * rows);
        return;
      }
      for (std::size_t r = 0; r < rows; ++r) std::memcpy(d + r * dpitch, s + r * spitch, width);
    };
    // A memcpy node of the caller's graph: reads src at replay.
    if (HostStreamCapture* caller = rec_.caller()) return caller->record(copy);
    copy();
  }
  void stage_fill(void* dst, int byte, std::size_t bytes) override {
    bound();
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memset (twin of cudaMemsetAsync)", fault::Site::kMemcpy);
    if (!bytes) return;
    if (HostStreamCapture* caller = rec_.caller())
      return caller->record([dst, byte, bytes] { std::memset(dst, byte, bytes); });
    std::memset(dst, byte, bytes);
  }
  void wait_staging_reusable(int) override { bound(); }
  void staging_done(int) override { bound(); }
  bool staging_reusable_now(int) override {
    bound();
    return !host_staging_copies_pending();
  }
  AddressRange address_range(const void*) const override {
    bound();
    return {};
  }

  // ------------------------------------------------------------ the step's stream, graphs: rec_
  void begin_step(std::optional<Stream> s) override { rec_.begin_step(s); }
  void end_step() noexcept override { rec_.end_step(); }
  bool in_caller_capture() const override { return rec_.in_caller_capture(); }
  void wait_last_step() override { bound(); }

  void begin_capture() override { rec_.begin_capture(); }
  std::unique_ptr<CapturedGraph> end_capture() override { return rec_.end_capture(); }
  std::unique_ptr<BackendGraph> instantiate(CapturedGraph& captured) override { return rec_.instantiate(captured); }
  bool update(BackendGraph& exec, CapturedGraph& captured) override { return rec_.update(exec, captured); }
  void abort_capture() noexcept override { rec_.abort_capture(); }
  void begin_caller_capture() override { rec_.begin_caller_capture(); }
  void end_caller_capture() override { rec_.end_caller_capture(); }
  Stream capture_stream() const override { return rec_.capture_stream(); }
  void launch(BackendGraph& g) override { rec_.launch(g); }
  double time_replays(BackendGraph& g, int replays) override { return rec_.time_replays(g, replays); }

  // ------------------------------------------------------------ ops (host_ops.hpp)
  void attention_v1(const DecodeArgs& args) override {
    enqueue([args] { run_attention_v1(args); });
  }
  void attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                    std::size_t workspace_bytes) override {
    enqueue([args, partition_size, workspace, workspace_bytes] {
      run_attention_v2(args, partition_size, workspace, workspace_bytes);
    });
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memcpy (twin of cudaMemcpyAsync)", fault::Site::kMemcpy);
    enqueue([host_dst, src, bytes] { std::memcpy(host_dst, src, bytes); });
  }
  void append(const AppendArgs& args) override {
    enqueue([args] { run_append(args); });
  }
  void host_work(std::function<void()> fn) override {
    if (!fn) throw_invalid("enqueue_host fn", "empty", "a callable");
    enqueue(std::move(fn));
  }

  bool switch_supported(std::string&) override {
    bound();
    return true;
  }
  bool programmatic_launch_supported(std::string& why) const override {
    why = "the host backend runs one op after another: nothing to overlap";
    return false;
  }
  bool read_for_stats(void* dst, const void* src, std::size_t bytes) noexcept override {
    bound();
    if (bytes) std::memcpy(dst, src, bytes);
    return true;
  }

  // ------------------------------------------------------------ band choice in the graph: rec_
  void band_select(const kernels::BandSelectParams& params) override { rec_.band_select(params); }
  void begin_switch(int branches) override { rec_.begin_switch(branches); }
  bool begin_branch(int branch, int key) override { return rec_.begin_branch(branch, key); }
  void end_branch() override { rec_.end_branch(); }
  void end_switch() override { rec_.end_switch(); }

 private:
  void* alloc_zeroed(std::size_t bytes, const char* call) {
    bound();
    if (fault::should_fail(fault::Site::kAlloc)) injected(call, fault::Site::kAlloc);
    const std::size_t n = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, n);
    if (!p) throw OutOfMemory(std::string(call) + " of " + std::to_string(bytes) + " bytes failed: out of memory");
    std::memset(p, 0, n);
    return p;
  }
  void enqueue(Node n) { rec_.enqueue(std::move(n)); }
  void bound() const { guard_.bound(); }

  HostDeviceDepth guard_;
  HostRecording rec_{guard_};
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace decodegraph::detail
