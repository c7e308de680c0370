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
// The append skips (and reports) a slot past the cache or not at its position, as the kernel does. host:: would throw instead, in the
// middle of a replay; the host backend gives it a sanitised copy, so both backends compute the same
// numbers and report the same way.
//
// Band choice in the graph (BandSelect::kDevice): the band-select node is a closure that runs
// kernels::select_band (the kernel's own __host__ __device__ math) on the staged lengths when the
// graph replays and stores the band in a cell the capture owns; each SWITCH node is a closure that
// runs the branch that cell names. Identical branches of a node share one recorded node list.
//
// A caller's stream capture (host_capture.hpp): a step given a HostStreamCapture's stream records
// its staging copies and its graph's work into that capture instead of running them.
//
// The device guard: enter_device/leave_device only count (device_guard.hpp); each operation counts
// whether it ran with none open, which tests read to check that every entry point binds the device.
#include <algorithm>
#include <chrono>
#include <climits>
#include <map>
#include <memory>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "executor/backend.hpp"
#include "executor/device_guard.hpp"
#include "executor/host_capture.hpp"
#include "executor/plan.hpp"
#include "executor/staging_ring.hpp"
#include "kernels/append_report.hpp"
#include "kernels/decode_math.hpp"

namespace decodegraph::detail {
namespace {

constexpr std::size_t kAlign = 256;

[[noreturn]] void injected(const char* call, fault::Site site) { fault::throw_injected(site, call); }

using Node = std::function<void()>;

class HostCaptured final : public CapturedGraph {
 public:
  HostCaptured(std::vector<Node> n, int count) : nodes(std::move(n)), node_count(count) {}
  std::vector<Node> nodes;
  int node_count = 0;  // every node, branches included (identical branches counted per branch)
};

// Runs `run(args)` as the kernels would see the staged inputs (see the top of this file).
template <class Run>
void run_with_device_semantics(const DecodeArgs& a, const Run& run) {
  const int bs = a.spec.block_size;
  const int window = math::read_window(a.spec.sliding_window, a.q_len);  // q_len rows read from row 0's window
  auto bad_id = [&](int32_t id) { return id < 0 || id >= a.num_blocks; };
  bool clean = true;
  for (int i = 0; i < a.num_seqs && clean; ++i) {
    const int len = a.seq_lens[i];
    if (len < 0 || len > a.max_seq_len || (len > 0 && len < a.q_len)) {
      clean = false;
      break;
    }
    const int32_t* row = a.block_tables + static_cast<int64_t>(i) * a.block_table_stride;
    for (int j = math::window_origin(len, window, bs) / bs; j < num_partitions(len, bs); ++j)
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
    if (lens[i] < a.q_len) lens[i] = 0;  // fewer tokens than query rows: the rows are left untouched
    int32_t* row = table.data() + static_cast<std::size_t>(i) * a.block_table_stride;
    // As the kernels: entries before a window's first block are never read, so never reported.
    for (int j = math::window_origin(lens[i], window, bs) / bs; j < num_partitions(lens[i], bs); ++j) {
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

// The append as the kernel does it: a slot past the cache, or (with the staged lengths and tables)
// not the slot of its position or under a bad block id, is skipped and the first one reported
// through args.bad_slot
// (kernels/append_report.hpp, the kernel's own check); host:: would throw in the middle of a replay.
void run_append_with_device_semantics(const AppendArgs& args) {
  std::vector<int64_t> slots(args.slot_mapping, args.slot_mapping + args.num_tokens);
  for (int t = 0; t < args.num_tokens; ++t) {
    if (slots[t] < 0) continue;
    const int code = kernels::check_append_slot(slots[t], args.num_blocks, args.seq_lens, args.block_tables,
                                                args.block_table_stride, args.spec.block_size, t, args.tokens_per_seq);
    if (code == 0) continue;
    slots[t] = -1;
    if (args.bad_slot != nullptr && *args.bad_slot == 0) *args.bad_slot = code;
  }
  AppendArgs a = args;
  a.slot_mapping = slots.data();
  a.seq_lens = nullptr;  // checked above
  a.block_tables = nullptr;
  a.bad_slot = nullptr;
  host::append_kv(a);
}

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

class HostBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kHost; }
  Stream stream() const override { return nullptr; }
  DeviceModel device_model(const AttentionSpec& spec) const override {
    bound();
    return host_device_model(spec);
  }
  int enter_device() override {
    ++depth_;
    count_host_device_entry();
    return 0;
  }
  void leave_device(int) noexcept override {
    --depth_;
    count_host_device_exit();
  }

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
    if (caller_) throw Error("host memcpy (twin of a synchronous cudaMemcpy) refused: the step's stream is being captured");
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
    if (caller_) return caller_->record(copy);  // a memcpy node of the caller's graph: reads src at replay
    copy();
  }
  void stage_fill(void* dst, int byte, std::size_t bytes) override {
    bound();
    if (fault::should_fail(fault::Site::kMemcpy)) injected("host memset (twin of cudaMemsetAsync)", fault::Site::kMemcpy);
    if (!bytes) return;
    if (caller_) return caller_->record([dst, byte, bytes] { std::memset(dst, byte, bytes); });
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

  void begin_step(std::optional<Stream> s) override {
    bound();
    caller_ = s ? HostStreamCapture::find(*s) : nullptr;
  }
  void end_step() noexcept override {
    caller_ = nullptr;
    recording_caller_ = false;
  }
  bool in_caller_capture() const override { return caller_ != nullptr; }
  void wait_last_step() override { bound(); }

  void begin_capture() override {
    bound();
    if (recording_caller_) throw Error("host capture begin (twin of cudaStreamBeginCapture) failed: recording into a caller's capture");
    if (capturing_) throw Error("host capture begin (twin of cudaStreamBeginCapture) failed: a capture is already active");
    if (fault::should_fail(fault::Site::kCaptureBegin))
      injected("host capture begin (twin of cudaStreamBeginCapture)", fault::Site::kCaptureBegin);
    reset_capture();
    capturing_ = true;
  }
  std::unique_ptr<CapturedGraph> end_capture() override {
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
  std::unique_ptr<BackendGraph> instantiate(CapturedGraph& captured) override {
    bound();
    if (fault::should_fail(fault::Site::kInstantiate))
      injected("host instantiate (twin of cudaGraphInstantiate)", fault::Site::kInstantiate);
    auto& c = static_cast<HostCaptured&>(captured);
    return std::make_unique<HostGraph>(std::move(c.nodes), c.node_count);
  }
  bool update(BackendGraph& exec, CapturedGraph& captured) override {
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
  void abort_capture() noexcept override {
    capturing_ = false;
    recording_caller_ = false;
    reset_capture();
  }
  void begin_caller_capture() override {
    bound();
    if (!caller_ || capturing_ || recording_caller_)
      throw Error("host caller capture (twin of recording into a stream capture): the step's stream is not being captured, or a capture is open");
    reset_capture();
    recording_caller_ = true;
  }
  void end_caller_capture() override {
    bound();
    if (!recording_caller_) throw Error("host caller capture end: none open");
    recording_caller_ = false;
    const bool open_switch = switch_ != nullptr;
    reset_capture();
    if (open_switch) throw Error("host caller capture end: a SWITCH node is still open");
  }
  Stream capture_stream() const override { return recording_caller_ ? caller_->stream() : nullptr; }
  void launch(BackendGraph& g) override {
    bound();
    if (capturing_ || caller_) throw Error("host graph launch (twin of cudaGraphLaunch) failed: called during a capture");
    if (fault::should_fail(fault::Site::kGraphLaunch))
      injected("host graph launch (twin of cudaGraphLaunch)", fault::Site::kGraphLaunch);
    static_cast<HostGraph&>(g).run();
  }
  double time_replays(BackendGraph& g, int replays) override {
    if (caller_) throw Error("kMeasured timing refused: the step's stream is being captured");
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
      run_append_with_device_semantics(args);
    });
  }
  void host_work(std::function<void()> fn) override {
    if (!fn) throw_invalid("enqueue_host fn", "empty", "a callable");
    enqueue(std::move(fn));
  }

  bool switch_supported(std::string&) override {
    bound();
    return true;
  }
  bool read_for_stats(void* dst, const void* src, std::size_t bytes) noexcept override {
    bound();
    if (bytes) std::memcpy(dst, src, bytes);
    return true;
  }

  void band_select(const kernels::BandSelectParams& params) override {
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
  void begin_switch(int branches) override {
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
  bool begin_branch(int branch, int key) override {
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
  void end_branch() override {
    if (!switch_ || switch_->branch < 0) throw Error("host SWITCH branch end: no branch open");
    const int b = switch_->branch;
    if (switch_->fresh) {
      // What was recorded since begin_branch went into this branch (see enqueue()).
      switch_->counts[b] = count_ - saved_count_;
      count_ = saved_count_;
    }
    switch_->branch = -1;
  }
  void end_switch() override {
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

 private:
  static void check_kernel(const char* name) {
    if (fault::should_fail(fault::Site::kKernelLaunch))
      injected((std::string(name) + " launch (twin of a kernel launch)").c_str(), fault::Site::kKernelLaunch);
  }
  void* alloc_zeroed(std::size_t bytes, const char* call) {
    bound();
    if (fault::should_fail(fault::Site::kAlloc)) injected(call, fault::Site::kAlloc);
    const std::size_t n = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, n);
    if (!p) throw OutOfMemory(std::string(call) + " of " + std::to_string(bytes) + " bytes failed: out of memory");
    std::memset(p, 0, n);
    return p;
  }
  // Outside a capture an op runs at once (eager); inside, it is recorded, into the open branch of a
  // SWITCH node when there is one. On a caller's captured stream it goes into that capture.
  void enqueue(Node n) {
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
  void push_top(Node n) {
    if (capturing_)
      recorded_.push_back(std::move(n));
    else
      caller_->record(std::move(n));
    ++count_;
  }
  // Counts an operation that ran with no device guard open (device_guard.hpp).
  void bound() const {
    if (depth_ <= 0) count_host_unbound_op();
  }
  void reset_capture() noexcept {
    recorded_.clear();
    switch_.reset();
    band_.reset();
    count_ = saved_count_ = switches_ = 0;
  }

  struct OpenSwitch {
    std::vector<std::shared_ptr<std::vector<Node>>> branches;
    std::vector<int> counts;       // nodes of each branch
    std::map<int, int> by_key;     // branch key -> the first branch recorded with it
    int branch = -1;               // the branch being recorded
    bool fresh = false;            // ... and it is recorded anew (not a reused one)
  };

  bool capturing_ = false;
  HostStreamCapture* caller_ = nullptr;  // the step's stream is this caller's capture
  bool recording_caller_ = false;        // begin_caller_capture .. end_caller_capture
  int depth_ = 0;                        // device guards open
  std::vector<Node> recorded_;
  int count_ = 0, saved_count_ = 0, switches_ = 0;
  std::shared_ptr<int> band_;  // the capture's band-select cell
  std::unique_ptr<OpenSwitch> switch_;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace decodegraph::detail
