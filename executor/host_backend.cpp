// Host backend: the executor's graph semantics on the CPU.
//
// "Capture" records each op as a closure with its arguments bound by value (pointers included);
// "instantiate" freezes the list; "launch" reruns it through the host implementation. A value the
// caller changes after capture is therefore not seen unless it lives in a staged buffer (whose
// address is what got bound), exactly as with a CUDA graph. Executor memory is plain host memory at
// fixed addresses for the executor's lifetime. Streams do not exist here: every step runs inside
// step(), so a caller's stream is accepted and ignored.
//
// Attention runs with the kernels' semantics for staged inputs that validation did not see
// (kCheap, or device inputs with a max_seq_len hint): lengths clamped to [0, max_seq_len], block
// ids clamped to [0, num_blocks) and the first bad id reported through DecodeArgs::bad_block.
// The append skips a slot past the cache, as the kernel does. host:: would throw instead, in the
// middle of a replay; the host backend gives it a sanitised copy, so both backends compute the same
// numbers and report the same way.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "executor/backend.hpp"
#include "executor/plan.hpp"

namespace decodegraph::detail {
namespace {

constexpr std::size_t kAlign = 256;

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

using Node = std::function<void()>;

class HostCaptured final : public CapturedGraph {
 public:
  explicit HostCaptured(std::vector<Node> n) : nodes(std::move(n)) {}
  std::vector<Node> nodes;
};

// Runs `run(args)` as the kernels would see the staged inputs (see the top of this file).
template <class Run>
void run_with_device_semantics(const DecodeArgs& a, const Run& run) {
  const int bs = a.spec.block_size;
  auto bad_id = [&](int32_t id) { return id < 0 || id >= a.num_blocks; };
  bool clean = true;
  for (int i = 0; i < a.num_seqs && clean; ++i) {
    const int len = a.seq_lens[i];
    if (len < 0 || len > a.max_seq_len) {
      clean = false;
      break;
    }
    const int32_t* row = a.block_tables + static_cast<int64_t>(i) * a.block_table_stride;
    for (int j = 0; j < num_partitions(len, bs); ++j)
      if (bad_id(row[j])) {
        clean = false;
        break;
      }
  }
  if (clean) {
    run(a);
    return;
  }
  std::vector<int32_t> lens(a.seq_lens, a.seq_lens + a.num_seqs);
  std::vector<int32_t> table(a.block_tables,
                             a.block_tables + static_cast<std::size_t>(a.num_seqs) * a.block_table_stride);
  int first_bad = 0;
  for (int i = 0; i < a.num_seqs; ++i) {
    lens[i] = std::clamp(lens[i], 0, a.max_seq_len);
    int32_t* row = table.data() + static_cast<std::size_t>(i) * a.block_table_stride;
    for (int j = 0; j < num_partitions(lens[i], bs); ++j) {
      if (!bad_id(row[j])) continue;
      if (first_bad == 0) {
        const int64_t flat = static_cast<int64_t>(i) * a.block_table_stride + j + 1;
        first_bad = flat < INT_MAX ? static_cast<int>(flat) : INT_MAX;
      }
      row[j] = row[j] < 0 ? 0 : a.num_blocks - 1;
    }
  }
  if (first_bad != 0 && a.bad_block != nullptr && *a.bad_block == 0) *a.bad_block = first_bad;
  DecodeArgs b = a;
  b.seq_lens = lens.data();
  b.block_tables = table.data();
  run(b);
}

class HostGraph final : public BackendGraph {
 public:
  explicit HostGraph(std::vector<Node> nodes) : nodes_(std::move(nodes)) {}
  int nodes() const override { return static_cast<int>(nodes_.size()); }
  std::size_t bytes() const override { return 0; }
  void run() const {
    for (const Node& n : nodes_) n();
  }
  void replace(std::vector<Node> nodes) { nodes_ = std::move(nodes); }

 private:
  std::vector<Node> nodes_;
};

class HostBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kHost; }
  Stream stream() const override { return nullptr; }
  DeviceModel device_model(const AttentionSpec& spec) const override { return host_device_model(spec); }

  void* alloc(std::size_t bytes) override { return alloc_zeroed(bytes, "host alloc (twin of cudaMalloc)"); }
  void free(void* p) noexcept override { std::free(p); }
  void* alloc_host(std::size_t bytes) override {
    return alloc_zeroed(bytes, "host alloc (twin of cudaMallocHost)");
  }
  void free_host(void* p) noexcept override { std::free(p); }

  void upload(void* dst, const void* src, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memcpy (twin of cudaMemcpy)", fault::Site::kMemcpy);
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes, MemorySpace) override {
    // Host backend: "device" inputs are host memory too.
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memcpy (twin of cudaMemcpy)", fault::Site::kMemcpy);
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void stage_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                std::size_t rows, MemorySpace) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memcpy (twin of cudaMemcpy2DAsync)", fault::Site::kMemcpy);
    if (width == 0) return;
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    if (dpitch == width && spitch == width) {
      std::memcpy(d, s, width * rows);
      return;
    }
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(d + r * dpitch, s + r * spitch, width);
  }
  void stage_fill(void* dst, int byte, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memset (twin of cudaMemsetAsync)", fault::Site::kMemcpy);
    if (bytes) std::memset(dst, byte, bytes);
  }
  void wait_staging_reusable() override {}
  void staging_done() override {}
  AddressRange address_range(const void*) const override { return {}; }

  void begin_step(std::optional<Stream>) override {}
  void end_step() noexcept override {}
  void wait_last_step() override {}

  void begin_capture() override {
    if (capturing_) throw Error("host capture begin (twin of cudaStreamBeginCapture) failed: a capture is already active");
    if (fault::should_fail(fault::Site::kCaptureBegin))
      injected("host capture begin (twin of cudaStreamBeginCapture)", fault::Site::kCaptureBegin);
    recorded_.clear();
    capturing_ = true;
  }
  std::unique_ptr<CapturedGraph> end_capture() override {
    if (!capturing_) throw Error("host capture end (twin of cudaStreamEndCapture) failed: no capture is active");
    capturing_ = false;
    std::vector<Node> nodes = std::move(recorded_);
    recorded_.clear();
    if (fault::should_fail(fault::Site::kCaptureEnd))
      injected("host capture end (twin of cudaStreamEndCapture)", fault::Site::kCaptureEnd);
    return std::make_unique<HostCaptured>(std::move(nodes));
  }
  std::unique_ptr<BackendGraph> instantiate(CapturedGraph& captured) override {
    if (fault::should_fail(fault::Site::kInstantiate))
      injected("host instantiate (twin of cudaGraphInstantiate)", fault::Site::kInstantiate);
    return std::make_unique<HostGraph>(std::move(static_cast<HostCaptured&>(captured).nodes));
  }
  bool update(BackendGraph& exec, CapturedGraph& captured) override {
    // An update that fails falls back to re-instantiation, as on CUDA; for host graphs both amount
    // to swapping the node list, so only the instantiate fault can make this throw.
    const bool refused = fault::should_fail(fault::Site::kGraphUpdate);
    if (refused && fault::should_fail(fault::Site::kInstantiate))
      injected("host instantiate (twin of cudaGraphInstantiate, after a failed update)", fault::Site::kInstantiate);
    static_cast<HostGraph&>(exec).replace(std::move(static_cast<HostCaptured&>(captured).nodes));
    return !refused;
  }
  void abort_capture() noexcept override {
    capturing_ = false;
    recorded_.clear();
  }
  void launch(BackendGraph& g) override {
    if (capturing_) throw Error("host graph launch (twin of cudaGraphLaunch) failed: called during a capture");
    if (fault::should_fail(fault::Site::kGraphLaunch))
      injected("host graph launch (twin of cudaGraphLaunch)", fault::Site::kGraphLaunch);
    static_cast<HostGraph&>(g).run();
  }
  double time_replays(BackendGraph& g, int replays) override {
    launch(g);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < replays; ++i) launch(g);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
           std::max(replays, 1);
  }

  void attention_v1(const DecodeArgs& args) override {
    enqueue([args] {
      check_kernel("host::paged_attention_v1");
      run_with_device_semantics(args, [](const DecodeArgs& a) { host::paged_attention_v1(a); });
    });
  }
  void attention_v2(const DecodeArgs& args, int partition_size, void* workspace,
                    std::size_t workspace_bytes) override {
    enqueue([args, partition_size, workspace, workspace_bytes] {
      check_kernel("host::paged_attention_v2");
      run_with_device_semantics(args, [&](const DecodeArgs& a) {
        host::paged_attention_v2(a, partition_size, workspace, workspace_bytes);
      });
    });
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memcpy (twin of cudaMemcpyAsync)", fault::Site::kMemcpy);
    enqueue([host_dst, src, bytes] { std::memcpy(host_dst, src, bytes); });
  }
  void append(const AppendArgs& args) override {
    enqueue([args] {
      check_kernel("host::append_kv");
      const int64_t cap = static_cast<int64_t>(args.num_blocks) * args.spec.block_size;
      if (std::none_of(args.slot_mapping, args.slot_mapping + args.num_tokens, [&](int64_t s) { return s >= cap; })) {
        host::append_kv(args);
        return;
      }
      std::vector<int64_t> slots(args.slot_mapping, args.slot_mapping + args.num_tokens);
      for (int64_t& s : slots)
        if (s >= cap) s = -1;  // skipped, as the kernel skips it
      AppendArgs a = args;
      a.slot_mapping = slots.data();
      host::append_kv(a);
    });
  }
  void host_work(std::function<void()> fn) override {
    if (!fn) throw_invalid("enqueue_host fn", "empty", "a callable");
    enqueue(std::move(fn));
  }

 private:
  static void check_kernel(const char* name) {
    if (fault::should_fail(fault::Site::kKernelLaunch))
      injected((std::string(name) + " launch (twin of a kernel launch)").c_str(), fault::Site::kKernelLaunch);
  }
  static void* alloc_zeroed(std::size_t bytes, const char* call) {
    if (fault::should_fail(fault::Site::kAlloc)) injected(call, fault::Site::kAlloc);
    const std::size_t n = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, n);
    if (!p) throw OutOfMemory(std::string(call) + " of " + std::to_string(bytes) + " bytes failed: out of memory");
    std::memset(p, 0, n);
    return p;
  }
  // Outside a capture an op runs at once (eager); inside, it is recorded.
  void enqueue(Node n) {
    if (capturing_)
      recorded_.push_back(std::move(n));
    else
      n();
  }

  bool capturing_ = false;
  std::vector<Node> recorded_;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace decodegraph::detail
