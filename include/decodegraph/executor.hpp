// The decode-step executor: captures the attention of a decode step (optionally the caller's whole
// step) into CUDA graphs and replays the right one each token step. Every bucket (batch bucket x
// length band) has a plan: V1 or V2, and V2's partition size, chosen by a KernelPolicy against a
// model of the GPU (docs/planning.md). Bands above the V1/V2 threshold always replay V2. Buckets whose
// launches are identical share one graph.
//
// Typical loop:
//   Executor ex(config);                    // plans every bucket, allocates static buffers
//   for each token step:
//     write q (and new K/V) into ex.query(l) / ex.new_key(l) / ex.new_value(l), or fixed buffers
//     StepResult r = ex.step(inputs, s);    // validate, bucket, stage, replay on stream s
//     read ex.output(l) (in stream order on s)
//
// Stream ordering (CUDA backend; docs/executor.md says the same at more length):
//  - step(inputs, s) enqueues this step's staging copies and its graph on s, in that order, and
//    returns without waiting. Work you enqueued on s before the call (q, new K/V, device-resident
//    inputs) is seen; work you enqueue on s after it sees the outputs and the appended KV. No event
//    edges are needed. s = nullptr is the legacy default stream, a real stream like any other.
//  - step(inputs), with no stream, runs on ex.stream(), a non-blocking stream the executor owns:
//    make your writes visible before the call (enqueue them on ex.stream(), or synchronise) and make
//    your stream wait on ex.stream() (or synchronise it) before reading outputs.
//  - Consecutive steps may use different streams. The executor orders each step after the previous
//    one whenever the stream changes (an event wait), so the static buffers every step shares
//    (staged inputs, V2 workspace, owned q/out, the bad-block flag) are never written while a
//    previous step still reads them. Your own work on the old stream after its step (reading the
//    outputs, say) is yours to order before the next step. Reusing the pinned staging buffers waits
//    on an event, whichever stream the previous step used; kMeasured times on the step's stream.
//  - Graphs do not depend on the stream: they are captured on ex.stream() (the legacy default
//    stream cannot be captured), so StepContext::stream() is ex.stream() during a capture.
//  - A stream the caller is capturing (an engine capturing its forward pass): step() records the
//    step's staging copies and its graph's work into that capture instead of launching a graph;
//    inputs must then be device buffers the caller fills before each replay (docs/executor.md,
//    "Running inside an engine's graph capture"). What cannot be recorded is an InvalidArgument.
//  - Every call that reaches the device runs on the device current when the executor was built and
//    restores the caller's current device before it returns (docs/executor.md, "Several devices").
//  - Host backend: the stream is accepted and ignored (every step runs synchronously in step()).
// Layers share one V2 workspace: a step body must not run two layers' attention concurrently on
// forked streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/types.hpp"

namespace decodegraph {

enum class BackendKind : int { kAuto = 0, kCuda = 1, kHost = 2 };
enum class CapturePolicy : int { kUpFront = 0, kLazy = 1 };
/// What step() checks on the host (docs/bad-input.md has the full table).
///  kCheap: counts, pointers, lengths (host inputs, or device inputs without a max_seq_len hint) and
///          the table width. Block ids and slots are not read on the host: the kernels clamp a bad
///          id into [0, num_blocks), the append skips a slot past the cache or not that of position
///          seq_len - 1 (one compare per token), and the first of these is reported through a flag
///          that the next step() or check_errors() turns into a CorruptedStepReport.
///  kFull:  also every block id a length uses against num_blocks, every slot against the cache size
///          and against the position seq_len - 1 of its sequence, and every length against the
///          max_seq_len hint (device inputs are copied to the host for this, synchronously).
enum class ValidationLevel : int { kCheap = 0, kFull = 1 };
/// Where step inputs (seq_lens, block tables, slot mapping) live.
enum class MemorySpace : int { kHost = 0, kDevice = 1 };

/// How each bucket's kernel and partition size are chosen (docs/planning.md). Above v2_threshold every
/// policy runs V2.
///  kAuto:      by predicted time: a cost model (KV and partials bytes against the read roof, waves of
///              blocks over the resident slots, the merge, kernel floors and launch gaps) scores V1
///              and V2 at many partition sizes at the band's lower edge, middle and upper edge, and
///              keeps the candidate with the least worst-case regret (predicted time over the best
///              candidate's at that length).
///  kThreshold: the plain rule, no model: V1 up to v2_threshold, V2 above (the seed's rule), with
///              partitions that fill target_blocks at the band's lower edge.
///  kMeasured:  times candidate graphs (V1, V2 at kAuto's partition size, half and twice it) when a
///              bucket is first captured and keeps the fastest: the ground truth. The plan records
///              each candidate's time beside the model's prediction.
enum class KernelPolicy : int { kAuto = 0, kThreshold = 1, kMeasured = 2 };

/// Where a step's band is chosen (docs/executor.md, "Band choice: kHost and kDevice").
///  kHost:   step() finds the longest length on the host (copying device-resident seq_lens back,
///           synchronously, unless a max_seq_len hint is given) and replays the graph of that
///           (batch bucket, band) plan: one graph per distinct plan.
///  kDevice: one graph per (q_len, batch bucket). A band-select kernel in the graph reduces the staged
///           lengths to their maximum, finds its band and sets one CUDA SWITCH node per attention
///           call, whose branch i holds exactly band i's launches (V1, or V2 pass 1 + merge).
///           Device-resident inputs need neither a host copy nor a hint. Needs conditional SWITCH
///           nodes (CUDA driver and runtime >= 12.8): checked at construction with the versions and
///           a one-time probe graph; where unsupported the executor falls back to kHost with one
///           log line (stats().band_select_note says why), never an error. The host backend models
///           the same graph: the branch follows the staged data when the graph replays.
/// A step body under kDevice may call attention() at most 256 times per graph (one SWITCH node each).
enum class BandSelect : int { kHost = 0, kDevice = 1 };

const char* to_string(BackendKind kind);
const char* to_string(CapturePolicy policy);
const char* to_string(KernelPolicy policy);
const char* to_string(BandSelect mode);
/// Parses "auto", "threshold" or "measured"; throws Error otherwise.
KernelPolicy parse_kernel_policy(const std::string& name);

/// What the planner assumes about the GPU. target_blocks = num_sms x blocks_per_sm: how many pass-1
/// blocks are resident at once. Zero fields are filled in at construction: CUDA queries the device
/// (SM count, and cudaOccupancyMaxActiveBlocksPerMultiprocessor for the exact pass-1 instantiation
/// the spec selects); the host backend models an H200: 132 SMs and the occupancy that the pass-1
/// kernel's registers and shared memory (as nvcc compiles it for sm_90) allow.
struct DeviceModel {
  int num_sms = 0;
  int blocks_per_sm = 0;
  int target_blocks() const { return num_sms * blocks_per_sm; }
};

/// ExecutorConfig::validation's default: kCheap, in every build of the library and of its callers
/// (it once followed the including file's NDEBUG, so two files of one program could disagree). Set
/// kFull while developing an engine: it catches block-id and slot mistakes before the step runs.
inline constexpr ValidationLevel kDefaultValidation = ValidationLevel::kCheap;

/// Why a plan runs its kernel.
enum class PlanReason : int {
  // 0 and 1 were kAuto's fill rule (kFillsGpu, kUnderfills) before the cost model.
  kAboveThreshold = 2,  // kThreshold, V2: band_hi > v2_threshold
  kThresholdRule = 3,   // kThreshold, V1: band_hi <= v2_threshold
  kMeasuredFastest = 4, // kMeasured: the fastest candidate
  kNotMeasured = 5,     // kMeasured, before the bucket's first capture: kAuto's choice, for now
  kLeastRegret = 6,     // kAuto: the least predicted worst-case regret over the band (V2 only above
                        // v2_threshold)
};
const char* to_string(PlanReason reason);

/// What the cost model (docs/planning.md, "The cost model") predicts for one attention call of a
/// plan's launch when every sequence of the batch has `len` tokens. Predictions, not measurements.
struct PlanPrediction {
  int len = 0;
  double us = -1;          // microseconds of one attention call (every kernel of one layer)
  double roof_share = 0;   // bench's bytes model (K+V, q, out, V2 partials) / (us x the model's read bandwidth)
  // us broken down (docs/planning.md, "The cost model"): us = loop_us + fixed_us + merge_us + launch_us.
  double loop_us = 0;      // pass 1's main loop: its blocks streaming (at the roof, their own rate or the issue cap)
  double fixed_us = 0;     // pass 1's block fixed phases: latency chain, prologue/epilogue instructions, idle blocks
  double merge_us = 0;     // V2's merge kernel (0 for V1)
  double launch_us = 0;    // kernel floors and the launch gaps between graph nodes
  double issue_us = 0;     // of loop_us: what the SM's instruction issue rate adds (0: not issue-bound)
};

/// One launch kMeasured times for a bucket.
struct PlanCandidate {
  KernelKind kernel = KernelKind::kV1;
  int partition_size = 0;  // V2
  double us = -1;          // microseconds per replay of every layer's attention; -1: not measured
  /// The model's microseconds for what `us` measures (num_layers attention calls), with every
  /// sequence at the band's middle: us / predicted_us - 1 is the model's error for this candidate.
  double predicted_us = -1;
};

/// Index of a batch bucket in config().batch_buckets: 0, 1, 2, ... Not a batch size (a size is what
/// StepResult::bucket_batch_size and plan_for_batch() take); explicit so one cannot pass for the other.
struct BucketIndex {
  int value = 0;
  constexpr explicit BucketIndex(int v) : value(v) {}
  friend constexpr bool operator==(BucketIndex a, BucketIndex b) { return a.value == b.value; }
};

/// The host-only plan of one bucket for one layer group.
struct BucketPlan {
  /// The layer group whose layers launch this plan (Executor::layer_group); 0 when every layer has
  /// one spec.
  int group = 0;
  int batch = 0;         // bucket batch size
  /// Query tokens per sequence of the steps this plan runs (ExecutorConfig::q_lens): its launches
  /// serve batch x q_len query rows.
  int q_len = 1;
  int band = 0;          // band index
  int band_lo = 0;       // lengths in (band_lo, band_hi]
  int band_hi = 0;
  KernelKind kernel = KernelKind::kV1;
  int partition_size = 0;  // V2 only
  int max_partitions = 0;  // V2 only
  int grid_x = 0, grid_y = 0, grid_z = 0;     // attention (V1 or V2 pass 1) grid
  int merge_grid_x = 0, merge_grid_y = 0;     // V2 pass 2 grid: query rows x query heads, 1,
  int merge_grid_z = 0;                       // and slices of 32 head elements
  std::size_t workspace_bytes = 0;            // V2 partials
  /// Longest length the launches are sized for (their max_seq_len): band_hi for V2; for V1 the
  /// largest V1 band edge, min(v2_threshold, max_seq_len), so that the V1 launches of a batch bucket
  /// are identical across bands and share a graph. Every bucket replaying a graph has band_hi <= it.
  int launch_len = 0;
  /// The length the partitions are sized for: band_lo; for the first band (band_lo 0),
  /// max(1, band_hi / 2) (docs/planning.md says why). A windowed group's is at most its window.
  int design_len = 0;
  /// The layer group's sliding window W (0: none). Its plans are for the min(L, W) tokens a step
  /// reads, not the band's lengths: a short window runs V1 in every band.
  int window = 0;
  int blocks = 0;                  // pass-1 blocks launched: grid_x * grid_y * grid_z
  int target_blocks = 0;           // resident pass-1 blocks of the device model
  int live_blocks_at_band_lo = 0;  // pass-1 blocks with work when every sequence has design_len tokens
  double waves = 0;                // blocks / target_blocks: the launch's size in resident slots
  /// The cost model's prediction for this plan's launch with every sequence at the band's lower edge
  /// (band_lo + 1 tokens; the first band: max(1, band_hi / 2), as design_len), its middle and its
  /// upper edge (band_hi): the lengths kAuto scores. Set for every policy; predicted_hi.us is the
  /// plan's predicted microseconds per attention call, and predicted_hi.roof_share its predicted
  /// share of the roof.
  PlanPrediction predicted_lo, predicted_mid, predicted_hi;
  /// kAuto: the chosen launch's worst-case regret over those lengths (its predicted time over the
  /// best candidate's at the same length, minus 1; 0 when it is the best at all three), and how many
  /// candidates were scored. 0 under the other policies.
  double predicted_regret = 0;
  int candidates_scored = 0;
  PlanReason reason = PlanReason::kLeastRegret;
  /// The launch id: which distinct launch sequence this bucket runs (ExecutorStats::distinct_plans of
  /// them), the same in every layer group's plan of the bucket; buckets whose launches are identical
  /// in every group share one. Under BandSelect::kHost it is also the graph the bucket replays
  /// (GraphStats::graph_id); under kDevice the graph is the (q_len, batch bucket)'s and this names the SWITCH
  /// branch (StepResult::launch_id, GraphStats::band_launch_ids). -1: not decided yet (kMeasured,
  /// before the bucket's first capture).
  int graph_id = -1;
  /// kMeasured: the candidates, with their measured time once the bucket has been captured.
  std::vector<PlanCandidate> candidates;
};

/// Formats plans as an aligned text table (for logs, the CLI and bug reports). Plans of more than one
/// layer group get a "group" column, and plans of q_len > 1 an "n" column (q_len; a table of q_len 1
/// only is unchanged).
std::string format_plan_table(const std::vector<BucketPlan>& plans);
/// One line saying why the plan runs its kernel, with the numbers that decided it.
std::string describe_reason(const BucketPlan& plan);

/// Per-layer buffers. KV caches are required. q/out/new K/V are optional: where null the executor
/// owns a buffer (exposed by query()/output()/new_key()/new_value()); where set, the address is fixed
/// into the graphs at capture, so it must stay valid until the executor is destroyed or the layers
/// are rebound (Executor::rebind_layers).
/// Shapes are those of the layer's own spec (ExecutorConfig::layer_specs).
struct LayerBuffers {
  void* k_cache = nullptr;    // [num_blocks, ...] in spec.layout (attention.hpp)
  void* v_cache = nullptr;
  /// max_rows = max_batch x the largest of ExecutorConfig::q_lens: a step of n = q_len tokens per
  /// sequence uses rows [num_seqs, n] (row s * n + j is token j of sequence s), as attention.hpp.
  void* q = nullptr;          // [max_rows, num_q_heads * head_size], rows q_stride apart
  void* out = nullptr;        // [max_rows, num_q_heads * head_size], rows out_stride apart
  void* new_key = nullptr;    // [max_rows, num_kv_heads * head_size], rows new_key_stride apart
  void* new_value = nullptr;  // [max_rows, num_kv_heads * head_size], rows new_value_stride apart
  /// Elements between consecutive rows (sequences) of q / out / new_key / new_value; 0 = contiguous.
  /// Otherwise at least one row and a multiple of 16 bytes. Only for caller buffers: executor-owned
  /// ones are contiguous, so a stride with a null pointer is rejected. A fused QKV buffer
  /// [max_batch, (num_q_heads + 2 * num_kv_heads) * head_size] is q = base, new_key = base +
  /// num_q_heads * head_size, new_value = new_key + num_kv_heads * head_size, all three strides
  /// (num_q_heads + 2 * num_kv_heads) * head_size.
  int64_t q_stride = 0;
  int64_t out_stride = 0;
  int64_t new_key_stride = 0;
  int64_t new_value_stride = 0;
  /// Optional: bytes from k_cache / v_cache to the end of their allocation (0 = not given). When
  /// given, each must hold num_blocks blocks (num_blocks * spec.block_bytes()), else the
  /// executor rejects the layer. The CUDA backend also asks the driver for the allocation's range
  /// and checks that, given or not; the host backend can only check what is given here.
  std::size_t k_cache_bytes = 0;
  std::size_t v_cache_bytes = 0;
  /// fp8 caches (spec.kv_dtype): the layer's dequantisation scales, fp32 [spec.kv_scale_count()]
  /// (one value, or one per KV head) in device memory (host memory on the host backend) that the
  /// caller owns and keeps in place like the caches; required there, ignored for kv_dtype auto.
  /// The kernels read them each time they run, so new values written between two steps (a
  /// recalibration) apply from the next step on, with no recapture; the appends quantise with them
  /// too (attention.hpp). rebind_layers may point them elsewhere.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  /// Attention sinks (gpt-oss): fp32 [num_q_heads of the layer's spec] raw logits, one per query
  /// head, entering the softmax denominator only (attention.hpp, DecodeArgs::sinks); null = none
  /// (-inf for one head is none for that head). Device memory (host memory on the host backend) the
  /// caller owns and keeps in place; read each time the kernels run, so new values apply at the next
  /// step with no recapture. rebind_layers may point them elsewhere.
  const float* sinks = nullptr;
};

struct ExecutorConfig {
  /// Every layer's spec, unless layer_specs is set; then the fields every layer shares (block_size,
  /// dtype, layout).
  AttentionSpec spec;
  /// Empty: every layer uses `spec`. Otherwise one spec per layer (size num_layers). Layers with
  /// equal specs form a *layer group* (numbered in the order of their first layer:
  /// Executor::layer_group); plans are made per (layer group, batch bucket, band), and every layer's
  /// launch follows its group's plan; one graph still holds every layer (docs/planning.md, "Layer
  /// groups"). A layer's spec may differ from `spec` in num_q_heads, num_kv_heads, head_size, scale,
  /// kv_dtype, kv_scale_per_head, sliding_window and logit_softcap; block_size, dtype and layout are
  /// spec's (InvalidArgument naming layer_specs[l].<field> otherwise; docs/features.md, "Per layer").
  /// Gemma 3's five local layers (a 1024-token window) to one global:
  ///   for (int l = 0; l < 62; ++l) cfg.layer_specs.push_back(l % 6 == 5 ? global : local);
  std::vector<AttentionSpec> layer_specs;
  /// ALiBi slopes [num_q_heads] (host values; copied into executor memory). Empty: no ALiBi. With
  /// layer_specs, every layer must have this many query heads.
  std::vector<float> alibi_slopes;

  int num_layers = 1;
  std::vector<LayerBuffers> layers;  // size num_layers
  int max_batch = 8;
  /// Query tokens per sequence the executor captures graphs for (speculative decoding: 1 + k for k
  /// drafted tokens, e.g. {1, 4} for EAGLE with k = 3, whose steps without drafts run n = 1). Each
  /// in 1..kMaxQLen, no duplicates, not empty; config() lists them ascending. Plans and graphs are
  /// made per (q_len, batch bucket, band); every step names its q_len (StepInputs::q_len).
  std::vector<int> q_lens = {1};
  int max_seq_len = 8192;
  int num_blocks = 0;
  /// Block-table row width; 0 means ceil(max_seq_len / block_size).
  int max_blocks_per_seq = 0;

  /// Bands with upper edge > threshold always run V2; at or below it, `policy` decides.
  int v2_threshold = 8192;
  /// Upper edges of the length bands, increasing, containing v2_threshold (when < max_seq_len) and
  /// ending at max_seq_len. Empty: powers of two from 512 up to max_seq_len, plus the threshold.
  std::vector<int> band_edges;
  /// Captured batch sizes, increasing, ending at max_batch. Empty: 1, 2, 4, 8, then steps of 8 up to
  /// 256 and of 16 beyond, capped at max_batch (which is always a bucket).
  std::vector<int> batch_buckets;
  /// V2 partition size: a multiple of block_size, or 0 for "auto" (per bucket, by the policy: kAuto's
  /// cost model, kThreshold's balanced partitions of at least 256 tokens that fill target_blocks at
  /// the band's lower edge; see docs/planning.md).
  int partition_size = 0;
  KernelPolicy policy = KernelPolicy::kAuto;
  /// The GPU the plans are made for; zero fields are queried (CUDA) or modelled (host: an H200), for
  /// each layer group's own pass-1 kernel (its occupancy follows head size, dtype and GQA group:
  /// BucketPlan::target_blocks). config() shows layer group 0's.
  DeviceModel device_model;
  /// kMeasured: timed replays per candidate, after one warm-up replay.
  int measure_replays = 3;
  /// kMeasured test hook: when set, a candidate's microseconds per replay are what this returns,
  /// instead of the time its replays took (they still run). Makes measured plans deterministic.
  std::function<double(const BucketPlan& bucket, const PlanCandidate& candidate)> measure_clock;
  /// Where each step's band is chosen; kDevice falls back to kHost where SWITCH nodes are missing.
  BandSelect band_select = BandSelect::kDevice;
  /// Test hook: when set, its result replaces the one-time SWITCH-node probe's (false: behave as a
  /// driver without conditional nodes, so kDevice falls back to kHost).
  std::function<bool()> switch_probe;

  CapturePolicy capture = CapturePolicy::kLazy;
  BackendKind backend = BackendKind::kAuto;
  /// kCheap (kDefaultValidation) unless set: the same in Debug and Release builds.
  ValidationLevel validation = ValidationLevel::kCheap;
  /// Attention-only step: append each layer's new K/V at slot_mapping before its attention.
  bool append_kv = true;
  /// Programmatic dependent launch (PDL) inside the graphs: the append, pass 1 and the merge are
  /// launched so that each may start while the kernel before it drains (captured as programmatic
  /// edges). Each of them waits (griddepcontrol.wait) before it touches global memory, so this is
  /// correct whatever runs before it, a kernel of the caller's included. In effect only on a CUDA
  /// device of compute capability 9.0 or newer, and only where every upstream node of the launch is
  /// a kernel node (after a copy, a SWITCH node or at the start of a SWITCH branch, the launch is
  /// fully ordered as without PDL); stats().programmatic_launch says whether it is in effect and
  /// programmatic_launch_note why not. false: every launch fully ordered. The speed-up is not
  /// measured yet (docs/benchmarks.md, "Programmatic dependent launch").
  bool programmatic_launch = true;
  /// Device memory the executor may use (static buffers + workspace + graphs); 0 = unlimited.
  /// Buffers are checked at construction, each graph at its capture (kUpFront: construction); a
  /// bucket whose graph does not fit throws on every step that needs it, without being recaptured.
  std::size_t memory_budget_bytes = 0;
  /// Log level: trace, debug, info, warn, err, critical or off, in any case. An unknown name here
  /// is the caller's own argument and throws InvalidArgument. Empty: the DECODEGRAPH_LOG_LEVEL
  /// environment variable, where an unknown value only warns (once per value) and keeps "warn";
  /// else "warn".
  std::string log_level;
};

struct StepInputs {
  int num_seqs = 0;
  /// [num_seqs] tokens of each sequence INCLUDING the n tokens appended this step (their new K/V):
  /// n..max_seq_len. Attention covers positions 0 .. seq_len - 1. 0 marks a padded row (vLLM pads
  /// a graph batch so, as the eager calls accept): its output rows are left untouched and it
  /// appends nothing, so its slots must be negative (-1); host inputs are checked for that.
  const int32_t* seq_lens = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, block_table_stride] block ids
  /// Entries per row; at least ceil(longest seq_len / block_size), may be wider than
  /// max_blocks_per_seq (only the columns the longest sequence uses are staged).
  int block_table_stride = 0;
  /// [num_seqs, q_len] where each new token's K/V goes: entry (i, j) is the slot of position
  /// p = seq_len - q_len + j, block_tables[i][p / block_size] * block_size + p % block_size, or a
  /// negative value to skip that token's append (q_len 1: [num_seqs], position seq_len - 1).
  /// Required when KV append runs. kFull checks every position before the step; kCheap's append
  /// skips a slot past the cache or not that of its token's position and reports it
  /// (CorruptedStepReport naming the entry, its sequence and, for q_len > 1, its token).
  const int64_t* slot_mapping = nullptr;
  MemorySpace space = MemorySpace::kHost;
  /// Optional upper bound on every seq_len of this step (0 = none). The block-table columns staged
  /// come from it instead of from the lengths, and so does the band under BandSelect::kHost (under
  /// kDevice the graph picks the band from the staged lengths themselves).
  ///  - Device inputs: with a hint step() reads nothing back (no host synchronisation). Without one,
  ///    under BandSelect::kHost it copies seq_lens to the host synchronously on the step's stream,
  ///    which also waits for all work queued there before, including the previous step's graph;
  ///    under kDevice (kCheap) it reads nothing back either: the graph finds the band itself.
  ///  - A hint below a real length is the caller's bug that kCheap cannot see for device inputs:
  ///    the kernels clamp each length to the band's upper edge and read table columns past the hint
  ///    that were not staged this step, so that sequence's output is wrong (never out of bounds).
  ///    kFull (which copies and checks everything) and host inputs reject it.
  ///  - A hint above the longest length is valid; under kHost it may select a longer band than needed.
  int max_seq_len = 0;
  /// Query tokens per sequence this step (n; last, so that aggregate initialisation
  /// of the fields before it is unchanged), one of config().q_lens; the same for every sequence.
  /// q/out and new K/V rows are [num_seqs, n] (row s * n + j); row j of a sequence of L tokens sits
  /// at position L - n + j and attends positions t <= L - n + j (attention.hpp).
  int q_len = 1;
};

/// The executor's pinned host staging buffers (Executor::host_staging()). Writing a step's inputs
/// here and pointing StepInputs at them (space kHost, block_table_stride = this block_table_stride)
/// lets step() DMA them as they are, skipping the copy into the staging buffers.
struct HostStaging {
  std::span<int32_t> seq_lens;      // [max_batch]
  std::span<int32_t> block_tables;  // [max_batch, block_table_stride]
  int block_table_stride = 0;       // = config().max_blocks_per_seq
  std::span<int64_t> slot_mapping;  // [max_batch * the largest q_len]: [num_seqs, q_len] used
};

struct StepResult {
  BucketIndex bucket{0};      // index of the batch bucket (plan_for(result) finds the plan)
  int bucket_batch_size = 0;  // that bucket's batch size: num_seqs rounded up to a bucket
  int q_len = 1;              // the step's query tokens per sequence (StepInputs::q_len)
  /// The band index, when known on the host: always under kHost; under kDevice when step() read
  /// the lengths (host inputs, or kFull), else -1 and band_hi, kernel and partition_size are not
  /// known either (0, kV1, 0): the graph chose the branch on the device. kernel and partition_size
  /// are layer group 0's (plan_for(group, bucket, band) has every group's).
  int band = 0;
  int band_hi = 0;
  KernelKind kernel = KernelKind::kV1;
  int partition_size = 0;
  bool band_on_device = false;  // kDevice: the replayed graph chose the band itself
  bool captured = false;  // this step captured (and instantiated) the bucket's graph
  bool measured = false;  // this step timed the bucket's candidates (kMeasured)
  /// The step's stream was being captured by the caller: the step's work was recorded into that
  /// capture (captured stays false: no graph of the executor's was captured or launched).
  bool in_caller_capture = false;
  /// The graph it replayed: the GraphStats with this graph_id in stats().graphs. Graphs are numbered
  /// by what one graph holds: under kHost one graph per launch (graph_id = launch_id), under kDevice
  /// one per (q_len, batch bucket): graph_id = q * batch buckets + bucket.value, q the index of the
  /// step's q_len in config().q_lens (bucket.value with one q_len).
  int graph_id = -1;
  /// The launch the step ran (its plan's BucketPlan::graph_id), when its band is known on the host;
  /// -1 when the graph chose the band on the device (band -1).
  int launch_id = -1;
};

class Executor;
namespace detail {
class Recorder;
}

/// Given to the step body while a bucket is captured. What it enqueues becomes the bucket's graph.
class StepContext {
 public:
  /// The stream being captured (CUDA backend): the executor's own stream, whichever stream steps
  /// later replay the graph on; for a step recorded into your own capture, your captured stream.
  /// Launch your own kernels on it.
  Stream stream() const;
  BackendKind backend() const;
  /// The plan of the graph being captured. The body runs once per distinct graph (and once more per
  /// captured graph at each rebind_layers), and buckets whose launches are identical share it: its
  /// kernel, batch, partitions, grids, workspace and launch_len hold for every bucket that replays it; band, band_lo and band_hi span those buckets (the lowest
  /// band, the lowest band_lo, the highest band_hi; under kMeasured, those decided so far). Size
  /// per-step work of your own by batch and launch_len, which bound every step the graph will replay.
  /// With several layer groups it is group 0's plan; each layer's attention() launches its own
  /// group's (the same batch and bands, and a launch_len that bounds the same steps).
  const BucketPlan& plan() const;
  /// Appends layer l's new K/V (staged slot_mapping) into its cache.
  void append_kv(int layer);
  /// Attention for layer l on its q/out buffers.
  void attention(int layer);
  /// Attention for layer l on caller buffers fixed into the graph (row strides in elements, 0 =
  /// contiguous; see LayerBuffers).
  void attention(int layer, const void* q, void* out, int64_t q_stride = 0, int64_t out_stride = 0);
  /// Records host work into the graph (host backend only; rejected on CUDA, use stream()).
  void enqueue_host(std::function<void()> fn);
  /// Staged device (or host-backend) copies: seq_lens [batch], block_tables, slot_mapping.
  const int32_t* seq_lens() const;
  const int32_t* block_tables() const;
  const int64_t* slot_mapping() const;

 private:
  friend class detail::Recorder;  // records the graphs the body runs in (executor/recorder.cpp)
  struct Impl;
  explicit StepContext(Impl* impl) : impl_(impl) {}
  Impl* impl_;
};

using StepBody = std::function<void(StepContext&)>;

/// One captured graph. A graph shared by several buckets appears once.
struct GraphStats {
  /// The graph's id (StepResult::graph_id): kHost, the launch id of its plans (BucketPlan::graph_id);
  /// kDevice, q * batch buckets + its batch bucket's index (q: the index of its q_len in
  /// config().q_lens; the bucket index with one q_len).
  int graph_id = 0;
  int batch = 0;
  int q_len = 1;  // query tokens per sequence of every step it replays
  int band = 0;       // lowest band that replays it
  int last_band = 0;  // highest band that replays it
  int band_lo = 0;    // lengths (band_lo, band_hi] over all its buckets
  int band_hi = 0;
  int buckets = 0;    // buckets that replay it
  KernelKind kernel = KernelKind::kV1;
  int partition_size = 0;
  int captures = 0;          // captured and instantiated anew
  int updates = 0;           // re-captured by rebind_layers and updated in place (cudaGraphExecUpdate)
  int reinstantiations = 0;  // re-captured by rebind_layers and instantiated again (update refused)
  long long replays = 0;
  int nodes = 0;
  double capture_ms = 0;
  double instantiate_ms = 0;
  double measure_ms = 0;  // kMeasured: timing the candidates of the buckets that chose this graph
  std::size_t bytes = 0;  // graph memory (CUDA estimate; 0 on host)
  /// kDevice: the graph of a whole batch bucket (bands band..last_band are the branches of its
  /// SWITCH nodes; kernel and partition_size are those of the longest band).
  bool switch_graph = false;
  int branches = 0;  // kDevice: distinct branches per SWITCH node (identical bands share one)
  /// kDevice: executions of each band's branch (index band - this.band), counted by the band-select
  /// kernel in executor memory and read by stats() (which waits for the last step); empty if that
  /// read failed.
  std::vector<long long> band_replays;
  std::vector<KernelKind> band_kernels;  // kDevice: each band's kernel
  /// Per layer group g (index g; kernel, partition_size and band_kernels above are group 0's):
  /// kHost, group g's kernel in this graph; kDevice, its kernel in the longest band.
  std::vector<KernelKind> group_kernels;
  /// kDevice: group_band_kernels[g][b] is group g's kernel in band (band + b)'s branch.
  std::vector<std::vector<KernelKind>> group_band_kernels;
  /// kDevice: each band's launch id (BucketPlan::graph_id: bands with the same id share a branch);
  /// kHost: empty (the graph is one launch, graph_id).
  std::vector<int> band_launch_ids;
};

struct ExecutorStats {
  std::vector<GraphStats> graphs;  // one per captured graph
  BandSelect band_select = BandSelect::kHost;  // the mode in effect (after any fallback)
  std::string band_select_note;  // why kDevice fell back to kHost; empty otherwise
  /// ExecutorConfig::programmatic_launch in effect: requested, and the device has it (sm_90+).
  bool programmatic_launch = false;
  std::string programmatic_launch_note;  // why it is not in effect; empty otherwise
  int buckets = 0;           // q_lens x batch buckets x bands
  /// Graphs the mode needs (each captured at most once): kHost, one per distinct decided plan;
  /// kDevice, one per (q_len, batch bucket).
  int distinct_graphs = 0;
  int distinct_plans = 0;    // distinct launch sequences (kHost's graphs, kDevice's distinct branches)
  int undecided_buckets = 0; // kMeasured: buckets not yet measured (their graph is not known yet)
  long long steps = 0;
  long long rejected_steps = 0;
  int total_captures = 0;
  double capture_ms = 0;      // all captures
  double instantiate_ms = 0;  // all instantiations
  double measure_ms = 0;      // kMeasured: capturing, replaying and timing candidates
  int measured_buckets = 0;
  int candidate_graphs = 0;   // candidate graphs captured and timed
  int rebinds = 0;                 // successful rebind_layers calls
  int graph_updates = 0;           // graphs rebind_layers updated in place
  int graph_reinstantiations = 0;  // graphs rebind_layers re-instantiated (the update was refused)
  /// Synchronous device-to-host copies of device-resident inputs (validation without a
  /// max_seq_len hint, or kFull). 0 on a sync-free device-input loop.
  long long input_downloads = 0;
  /// Bytes step() copied into the host staging buffers; inputs already written into host_staging()
  /// are not copied. The DMA to the device is not counted.
  long long staging_copy_bytes = 0;
  /// Delayed reports thrown (each one CorruptedStepReport): bad block ids and skipped slots.
  long long bad_block_reports = 0;
  long long caller_captures = 0;  // steps recorded into a caller's stream capture (also in steps)
  /// Replays of `kind`'s launches: kHost graphs by their kernel, kDevice graphs by branch execution;
  /// layer group 0's launches, or those of `group`.
  long long replays(KernelKind kind) const { return replays(kind, 0); }
  long long replays(KernelKind kind, int group) const;
};

struct MemoryReport {
  std::size_t static_buffers = 0;  // staged inputs, owned q/out/new K/V, alibi, the bad-block flag
  std::size_t workspace = 0;       // V2 partials (largest plan)
  std::size_t graphs = 0;          // graph memory reported by the driver (0 on host)
  std::size_t total() const { return static_buffers + workspace + graphs; }
};

class Executor {
 public:
  explicit Executor(ExecutorConfig config, StepBody body = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  Executor(Executor&&) noexcept;
  Executor& operator=(Executor&&) noexcept;

  /// Validates, buckets, stages and replays one decode step on the executor's own stream
  /// (stream()). Throws InvalidArgument on bad input and leaves the executor unchanged. Also throws
  /// CorruptedStepReport (an InvalidArgument), once, when an earlier step read an invalid block id
  /// or was given a wrong slot (see check_errors()); the step then runs nothing (submit it again),
  /// and the next call proceeds.
  StepResult step(const StepInputs& inputs);
  /// The same on the caller's stream: staging and replay are enqueued on `stream` (nullptr is the
  /// legacy default stream), ordered after earlier work there and before later work (see the top of
  /// this file). Host backend: `stream` is ignored.
  StepResult step(const StepInputs& inputs, Stream stream);
  /// The pinned host staging buffers, once the previous step's copies have read them (CUDA: an
  /// event wait). Write the next step's inputs there and pass StepInputs pointing at them: step()
  /// then skips its copy into them. Their contents are the caller's until the next step().
  /// There are three sets: the last step's when its copies are done already, else another, so the
  /// wait (when all three are in flight) is for the copies of two steps back and the host can run
  /// ahead. Calls without a step in between hand out the same set; inputs still pointing at an
  /// earlier set (exactly as handed out, all in one set) are staged from it.
  HostStaging host_staging();
  /// Points the graphs at new KV caches and layer buffers with the same shapes (a reallocated cache
  /// after a resize or sleep/wake, say): every captured graph is captured again (the step body runs
  /// again) and updated in place (cudaGraphExecUpdate; re-instantiated only where the update is
  /// refused, counted in stats()). Nothing is captured anew. `layers` follows ExecutorConfig::layers
  /// (null q/out/new K/V: executor-owned buffers). Waits for the last step first; when it returns no
  /// work of the executor reads the old buffers any more.
  /// Throws InvalidArgument, changing nothing, for layers the constructor would reject. If a
  /// re-capture fails (a step body throws, a CUDA error) nothing changes either. If an update and
  /// its re-instantiation fail, the new layers stay in effect and that graph is dropped, to be
  /// captured again when a step needs it.
  void rebind_layers(std::vector<LayerBuffers> layers);
  /// Waits for the last step to finish (a sync point; host: returns at once) and throws
  /// CorruptedStepReport if any step since the last report read a block id outside [0, num_blocks)
  /// or was given a slot past the cache or not that of its position (seq_len - 1; token j of q_len:
  /// seq_len - q_len + j) (possible under kCheap,
  /// which leaves ids and slots to the caller; the kernels clamp such an id and skip such a slot, so
  /// that sequence's output or new K/V is wrong). It names the sequence, the steps and what to do.
  /// The report is then cleared; the executor stays usable.
  void check_errors();
  /// Captures every bucket now (what CapturePolicy::kUpFront does in the constructor).
  void capture_all();

  BackendKind backend() const;
  /// The band choice in effect: config().band_select, or kHost after a fallback.
  BandSelect band_select() const;
  const ExecutorConfig& config() const;
  /// Every bucket's plan, bucket-major (index = bucket * bands + band), for each q_len of
  /// config().q_lens in turn (index = (q * buckets + bucket) * bands + band, q the q_len's index),
  /// for each layer group in turn (group-major: index = ((group * q_lens + q) * buckets + bucket) *
  /// bands + band). With one q_len (the default {1}) q is 0 throughout. kMeasured plans are final
  /// once their bucket has been captured.
  const std::vector<BucketPlan>& plans() const;
  /// Layer group `group`'s plans, q_len-major then bucket-major.
  std::span<const BucketPlan> plans(int group) const;
  /// The plan of batch bucket `bucket` (an index into config().batch_buckets) and band index `band`,
  /// for layer group 0 (every layer's, with one spec), or for layer group `group`; for steps of
  /// q_len `q_len` (one of config().q_lens), or without it of config().q_lens[0], the smallest (1 by
  /// default).
  const BucketPlan& plan_for(BucketIndex bucket, int band) const;
  const BucketPlan& plan_for(int group, BucketIndex bucket, int band) const;
  const BucketPlan& plan_for(int group, BucketIndex bucket, int band, int q_len) const;
  /// The plan a step ran (layer group 0's, of the step's q_len; StepResult's kernel and
  /// partition_size are its). Throws
  /// InvalidArgument when its band is not known on the host (band -1: kDevice with device-resident
  /// inputs and kCheap, where the graph chose the band itself); then plans_for(step.bucket) has
  /// every band's plan and stats().graphs[].band_replays counts the bands the graph ran.
  const BucketPlan& plan_for(const StepResult& step) const;
  /// Every band's plan of batch bucket `bucket`, band order (plans_for(b)[band] = plan_for(b, band)),
  /// for layer group 0, or for layer group `group`; of q_len `q_len`, or config().q_lens[0].
  std::span<const BucketPlan> plans_for(BucketIndex bucket) const;
  std::span<const BucketPlan> plans_for(int group, BucketIndex bucket) const;
  std::span<const BucketPlan> plans_for(int group, BucketIndex bucket, int q_len) const;
  /// The plan a step of `batch_size` sequences (1..max_batch) in band index `band` replays (group 0's),
  /// of q_len `q_len`, or config().q_lens[0].
  const BucketPlan& plan_for_batch(int batch_size, int band) const;
  const BucketPlan& plan_for_batch(int batch_size, int band, int q_len) const;
  /// Layers with equal specs (ExecutorConfig::layer_specs) form a layer group, numbered in the order
  /// of their first layer: layer 0 is in group 0. One group when layer_specs is empty.
  int num_layer_groups() const;
  int layer_group(int layer) const;
  /// The layers of `group`, ascending.
  const std::vector<int>& group_layers(int group) const;
  /// Layer `layer`'s spec: config().layer_specs[layer], or config().spec.
  const AttentionSpec& layer_spec(int layer) const;
  /// Every plan (format_plan_table); with several layer groups, a line per group (its layers and
  /// spec) first, and a group column.
  std::string plan_table() const;
  ExecutorStats stats() const;
  MemoryReport memory() const;
  /// The executor's own stream: steps given no stream run on it, and graphs are captured on it (CUDA
  /// backend); nullptr on host.
  Stream stream() const;

  /// Layer buffers (device memory on CUDA, host memory on the host backend).
  void* query(int layer);
  void* output(int layer);
  void* new_key(int layer);
  void* new_value(int layer);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Checks config.layer_specs as the Executor does: empty, or num_layers valid specs that share
/// spec's block_size, dtype and layout. Throws InvalidArgument naming layer_specs[l].<field>.
void validate_layer_specs(const ExecutorConfig& config);
/// Each layer's layer group (size num_layers), numbered as Executor::layer_group numbers them
/// (equal specs share one, in the order of their first layer), without building an Executor; for
/// reading plan_buckets()' plans by group. Checks layer_specs first (validate_layer_specs).
std::vector<int> layer_groups_of(const ExecutorConfig& config);

/// Default bands and buckets, exposed for tests and tools.
std::vector<int> default_band_edges(int max_seq_len, int v2_threshold);
std::vector<int> default_batch_buckets(int max_batch);

/// The host backend's device model for `spec`: an H200 (132 SMs) with the occupancy the pass-1
/// kernel's registers and shared memory allow there (read off ptxas for the current kernels).
DeviceModel host_device_model(const AttentionSpec& spec);

/// The plans an Executor with this configuration makes (graph ids included; every layer group's,
/// group-major as Executor::plans()), without building one: no backend, no memory, no layers needed.
/// Device-model fields left at 0 take the host model (an H200), per layer group. Throws Error for planning fields the Executor would reject (layers, caches and the other
/// fields planning does not read are not checked).
std::vector<BucketPlan> plan_buckets(const ExecutorConfig& config);

/// V2 partition size (docs/planning.md): the longest P that splits `design_len` into at least
/// `min_parts` balanced partitions, P = round_up(ceil(design_len / k), block_size) for some k (every
/// partition but the last within one cache block of the even share), and at least the minimum
/// partition (256 tokens rounded up to block_size). When even the minimum gives fewer than
/// `min_parts`, the minimum.
int balanced_partition_size(int design_len, int min_parts, int block_size);

/// The fill rule's V2 partition size (kThreshold's; kAuto's before the cost model) for a bucket of
/// `batch` sequences over (band_hi / 2, band_hi] with `num_sms` SMs and the host model's blocks per
/// SM. Kept for existing callers; use plan_buckets() or Executor::plan_for_batch(), which know the
/// bands, the device model and the policy.
[[deprecated("use plan_buckets() or Executor::plan_for_batch()")]]
int auto_partition_size(const AttentionSpec& spec, int batch, int band_hi, int num_sms);

}  // namespace decodegraph
