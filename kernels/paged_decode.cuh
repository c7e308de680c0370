// Paged decode attention, pass 1: V1 and V2 pass 1 share one device body.
//
// What it computes. For each (sequence, query head) and each partition of P tokens of the
// sequence's context, the online-softmax state of q against the partition's keys: the max logit m,
// l = sum exp(s - m) and acc = sum exp(s - m) * v. V1 has a single partition spanning the context
// and writes acc / l in the model dtype; V2 pass 1 writes the fp32 partials (m, l, acc / l) that
// merge_partitions.cuh folds together.
//
// Mapping. Grid: x = partition (V1: 1), y = KV head x head chunk, z = sequence. A block serves one
// KV head and heads_per_block (<= 16) query heads of its GQA group, one warp per query head, so K/V
// are read from memory once for all of them. Inside a warp, lanes form Z rows of L lanes
// (Pass1Policy in decode_policy.hpp): row z takes tokens [z*NR, (z+1)*NR) of every tile, and lane j
// of a row owns chunks j + k*L (k < KC) of the head dimension (q, and the output accumulators).
//
// Pipeline (TileLoader). Tiles of NTOK tokens cycle through S shared-memory stages as 16-byte
// cp.async copies with an L2 evict-first policy. Per iteration, for a whole-tile math: wait for tile
// t's group, one barrier, issue tile t+S-1, compute tile t (tiles t+1 .. t+S-1 in flight); for a
// split math (the tensor-core one): consume tile t, wait for tile t+1, one barrier (which also
// publishes what consume stored), issue tile t+S-1, accumulate tile t. The partition's last S - 1
// tiles (the tail) run after the loop, masked, with nothing left to issue; the tiles a row reads
// but partly must not attend are handled outside the loop too ("edge tiles" below).
// Block ids are read once per tile per block, S tiles ahead, into a small shared table of segment
// offsets; block_size enters as a shift and a mask. Pages are copied verbatim in their own layout
// (decode_policy.hpp places the chunks so that reads and writes are bank-conflict free); only the
// math knows how to read each layout, and the layout is a template parameter.
//
// Math (CudaCoreMath). Per tile and row: NR partial dot products in registers, a reduce-scatter
// across the row's lanes that leaves each lane one token's full dot (NR - 1 shuffles for NR tokens,
// instead of log2(L) per token), the logit and the online-softmax update on that (ex2.approx, one
// -inf guard per row), then p . v with each p broadcast by one shuffle. fp32 accumulation; every reduction has a fixed order, so results
// are deterministic (eager == graph, replays bitwise equal). The Z slices merge by shuffles at the end.
// A second math takes CudaCoreMath's place for fp16 / bf16 with GQA groups of 4 or more:
// TensorCoreMath (tensor_core_math.cuh, instantiated in inst/decode_tc_*.cu) gets the same loader,
// stages and driver, its own policy (TcPass1Policy: four warps, swizzled NHD rows), and
// launch_paged_decode selects it (pass1_uses_tensor_cores, decode_policy.hpp).
//
// Assumptions. Arguments validated by the launcher (validate_decode_args): 16-byte aligned tensors
// and row strides, block table wide enough for max_seq_len, supported shapes, partition_size a
// multiple of block_size. Lengths come from device memory and are clamped to max_seq_len, so nothing
// past a block-table row is read. Block ids outside [0, num_blocks) are clamped (and reported
// through bad_block when given), so a bad id never reads outside the cache. Tokens past the end of a
// tile are zero-filled by the copies themselves and get logit -inf (weight 0).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "decodegraph/fault.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/decode_math.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/decode_policy.hpp"
#include "kernels/device_ops.cuh"
#include "kernels/dtype_traits.cuh"
#include "kernels/kernel_launch.cuh"

namespace decodegraph::kernels {

inline constexpr unsigned kFullMask = 0xffffffffu;

/// The soft-cap as the kernels compute it: math::softcap2 on the hardware's approximate exp2 and
/// reciprocal (MUFU.EX2, MUFU.RCP; modelled by the simulator at their documented worst).
__device__ __forceinline__ float softcap2_dev(float s2, float cap2, float k2) {
  return math::softcap2(s2, cap2, k2, [](float x) { return dev::ex2(x); }, [](float x) { return dev::rcp(x); });
}

// ---------------------------------------------------------------- tile loader

/// Copies tiles of one (sequence, KV head) from the paged cache into shared-memory stages with
/// cp.async. The first kLoaderThreads threads take part, each with kLoadsPerThread fixed chunk slots
/// per operand (slot u of thread tid is chunk tid + u * kLoaderThreads of the tile, so consecutive
/// threads read consecutive 16-byte chunks of global memory). A slot's geometry (offset inside its
/// block, shared-memory position, token) depends only on the thread and the block size, so the
/// compiler computes it once; per tile a slot costs a segment lookup, an add, a compare and the copy.
/// KV: the cache's element type (its size is all the loader needs). P: the math's policy
/// (Pass1Policy or TcPass1Policy; they differ in the NHD stage rows).
template <typename KV, int D, KVLayout kLayout, class P>
struct TileLoader {
  static constexpr int E = sizeof(KV);
  static constexpr int CE = P::kChunkElems;
  static constexpr int CPT = P::kChunksPerToken;
  static constexpr int NTOK = P::kTileTokens;
  static constexpr int kThreads = P::kLoaderThreads;
  // Chunk slots of one operand: NHD walks the stage rows (padding included, skipped per slot).
  static constexpr int kSlots = kLayout == KVLayout::kNHD ? P::kOperandChunks : P::kTileChunks;
  static constexpr int U = (kSlots + kThreads - 1) / kThreads;
  static constexpr bool kEven = kSlots % kThreads == 0;
  static constexpr bool kPaddedRows = P::kNhdRowChunks != CPT;

  const char* k_base;    // cache base + this KV head's offset inside a block
  const char* v_base;
  uint32_t block_bytes;  // one block of one layer (all KV heads): < 4 GiB (kv_heads <= 65535: grid y)
  int token_bytes;       // NHD: between consecutive tokens of a block
  int block_size;
  int bs_log2;
  int bs_mask;
  int seg_log2;          // log2(TB), TB = min(block_size, NTOK): tokens of a tile in one block
  uint64_t policy;

  __device__ __forceinline__ TileLoader(const DecodeParams& p, int kv_head) {
    block_size = p.block_size;
    bs_log2 = p.block_size_log2;
    bs_mask = p.block_size - 1;
    seg_log2 = bs_log2 < ilog2(NTOK) ? bs_log2 : ilog2(NTOK);
    block_bytes = static_cast<uint32_t>(p.block_size) * static_cast<uint32_t>(p.num_kv_heads) * (D * E);
    token_bytes = p.num_kv_heads * D * E;
    const int64_t head = kLayout == KVLayout::kNHD ? static_cast<int64_t>(kv_head) * D * E
                                                  : static_cast<int64_t>(kv_head) * D * p.block_size * E;
    k_base = static_cast<const char*>(p.k_cache) + head;
    v_base = static_cast<const char*>(p.v_cache) + head;
    policy = dev::evict_first_policy();
  }

  /// Byte offset of the block holding tile token t (ids are clamped, so non-negative).
  __device__ __forceinline__ int64_t block(const int32_t* seg, int t) const {
    return static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(seg[t >> seg_log2])) * block_bytes);
  }

  /// Segments (cache blocks) one tile touches.
  __device__ __forceinline__ int segments() const { return NTOK >> seg_log2; }

  /// Raw block id of segment s of the tile at tile_start, or 0 when the segment lies past `end`
  /// (then none of its chunks is read). Index < block_table_stride: segment start < end <= max_seq_len.
  __device__ __forceinline__ int32_t load_id(const int32_t* table, int tile_start, int end, int s) const {
    const int b = (tile_start >> bs_log2) + s;
    return (b << bs_log2) < end ? __ldg(table + b) : 0;
  }

  /// Per-thread record of a clamped id: its table index (within the sequence's row) + 1, 0 for
  /// none; published after the main loop (report_bad_block). Shared memory, not a register: the
  /// kernels at their register caps have none to spare, and an atomic inside the loop cost a
  /// divergent branch per tile. Each thread writes and reads only its own entry (no barrier).
  __device__ __forceinline__ static int* bad_table() {
    __shared__ int table[P::kMaxSegments];
    return table;
  }
  /// A block id clamped to [0, num_blocks); a clamped one is recorded in bad_table (predicated,
  /// branch-free; a thread's last one stays).
  __device__ __forceinline__ static int32_t clamp_id(const DecodeParams& p, int32_t id, int index) {
    if (static_cast<uint32_t>(id) >= static_cast<uint32_t>(p.num_blocks)) bad_table()[threadIdx.x] = index + 1;
    return id < 0 ? 0 : id < p.num_blocks ? id : p.num_blocks - 1;
  }
  /// Table index of segment s of the tile at tile_start.
  __device__ __forceinline__ int segment_index(int tile_start, int s) const { return (tile_start >> bs_log2) + s; }

  /// Stores (seq * block_table_stride + index) + 1 of a clamped id into bad_block (first writer wins).
  __device__ __forceinline__ static void report_bad_block(const DecodeParams& p, int seq, int bad) {
    if (bad == 0 || p.bad_block == nullptr) return;
    // static-report: begin bad-block
    const int64_t flat = static_cast<int64_t>(seq) * p.block_table_stride + bad;
    atomicCAS(p.bad_block, 0, flat < INT_MAX ? static_cast<int>(flat) : INT_MAX);
    // static-report: end bad-block
  }

  /// Issues the copies of tokens [tile_start, tile_start + NTOK) into the stage at sk / sv (byte
  /// pointers; chunks placed by decode_policy.hpp). Chunks of tokens at or past `end` are
  /// zero-filled, never read. seg: the tile's (clamped) block ids.
  __device__ __forceinline__ void issue(char* sk, char* sv, const int32_t* seg, int tile_start, int end) const {
    const int tid = static_cast<int>(threadIdx.x);
    if (tid >= kThreads) return;
    const int t0 = tile_start & bs_mask;  // the tile's offset inside its first block (0 when TB = bs)
    const int tb_mask = (1 << seg_log2) - 1;
    const int left = end - tile_start;    // tokens of this tile that exist
    if constexpr (kLayout == KVLayout::kNHD) {
      // K and V alike: [token][chunk] in shared memory; a token's row is contiguous in the cache.
      const char* kb = k_base + static_cast<int64_t>(t0) * token_bytes;
      const char* vb = v_base + static_cast<int64_t>(t0) * token_bytes;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int q = tid + u * kThreads;
        const TileChunk ch = loader_chunk_nhd<P>(q);
        if ((kEven || q < kSlots) && (!kPaddedRows || ch.index < CPT)) {
          const int t = ch.token;
          const int at = smem_pos_nhd<P>(t, ch.index) * 16;
          const int64_t off = block(seg, t) + ((t & tb_mask) * token_bytes + ch.index * 16);
          const int src = t < left ? 16 : 0;
          dev::cp_async_16(sk + at, kb + off, src, policy);
          dev::cp_async_16(sv + at, vb + off, src, policy);
        }
      }
    } else {
      // K: the page is [chunk][token in block] (x = CE elements per chunk), copied in that order.
      const char* kb = k_base + t0 * 16;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int q = tid + u * kThreads;
        if (kEven || q < kSlots) {
          const TileChunk ch = loader_chunk_vllm_k<P>(q, seg_log2);
          const int t = ch.token;
          const int64_t off = block(seg, t) + ((ch.index << bs_log2) + (t & tb_mask)) * 16;
          dev::cp_async_16(sk + smem_pos_vllm_k<P>(t, ch.index) * 16, kb + off, t < left ? 16 : 0, policy);
        }
      }
      // V: the page is [d][token in block]; a chunk is CE consecutive tokens of one d.
      const char* vb = v_base + t0 * E;
      if (CE > 8 && block_size < CE) {
        // static-report: begin page8
        // fp8 pages of 8 tokens (block-uniform): a d-row of a block is 8 bytes, so stage chunk
        // (d, token group g) takes two halves, tokens 16g .. 16g + 7 and 16g + 8 .. 16g + 15 from
        // the group's two blocks (t0 = 0: tiles start on a block). Consecutive threads take
        // consecutive d: 8-byte steps through both pages.
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int q = tid + u * kThreads;
          if (kEven || q < kSlots) {
            const int d = q % D;
            const int t = (q / D) * CE;
            const int n_lo = cmin(cmax(left - t, 0), 8);
            const int n_hi = cmin(cmax(left - t - 8, 0), 8);
            dev::cp_async_8x2(sv + smem_pos_vllm_v<P>(d, q / D) * 16, vb + block(seg, t) + d * 8, n_lo,
                              vb + block(seg, t + 8) + d * 8, n_hi, policy);
          }
        }
        return;
        // static-report: end page8
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int q = tid + u * kThreads;
        if (kEven || q < kSlots) {
          const TileChunk ch = loader_chunk_vllm_v<P, D>(q, seg_log2);
          const int t = ch.token;
          const int d = ch.index;
          const int64_t off = block(seg, t) + (d * block_size + (t & tb_mask)) * E;
          const int n = cmin(cmax(left - t, 0), CE);  // tokens of this chunk that exist
          dev::cp_async_16(sv + smem_pos_vllm_v<P>(d, t / CE) * 16, vb + off, n * E, policy);
        }
      }
    }
  }
};

// ---------------------------------------------------------------- the block's heads

/// The KV head and head chunk a block serves (grid y = kv_heads x head_chunks); the chunk's query
/// heads are heads_per_block consecutive heads of the group from chunk * heads_per_block on.
struct BlockHeads {
  int kv_head;
  int chunk;
};
__device__ __forceinline__ BlockHeads block_heads(const DecodeParams& p) {
  const int y = static_cast<int>(blockIdx.y);  // < 65536 (the launcher checks)
  const int kv_head = small_div(y, p.head_chunks_magic);
  return BlockHeads{kv_head, y - kv_head * p.head_chunks};
}

// ---------------------------------------------------------------- math (CUDA cores)
// A math (see docs/kernels.md, "Adding a second math") is a class template Math<T, KV, D, Layout>
// (T: q, out and the math's element type; KV: the cache's) with
//   Policy                           its tile / stage policy (the loader and the driver follow it);
//   kSplitTile                       false: consume folds a whole tile; true: consume and then,
//                                    after the driver's barrier (which publishes what consume
//                                    stored in shared memory), accumulate(sv) finish it;
//   bool init(p, seq, len)           load q, reset the state; false: this warp takes no part
//                                    (warp-uniform; such warps only copy);
//   consume<kMasked>(sk, sv, tile_start, end)
//                                    fold one tile (shared addresses of its K and V parts);
//                                    kMasked for the tail's tiles only (the last tile is the only
//                                    one that can hold tokens at or past `end`; every tile masks
//                                    by window and causality);
//   finish(), write(p, seq, part)    merge what lanes keep, write V1 output or V2 partials;
//   poison_rows(p, len, pred)        after finish: makes NaN each of the thread's rows whose query
//                                    position satisfies pred (poison_edge).

/// One warp per query head: q and the output accumulators in registers, per-row logits in
/// registers, shuffles for every reduction. The cache holds T too (fp8 caches run on tensor cores).
template <typename T, typename KV, int D, KVLayout kLayout>
struct CudaCoreMath {
  static_assert(std::is_same_v<T, KV>, "the CUDA-core math reads caches of the model dtype");
  using Policy = Pass1Policy<sizeof(T), D>;
  using P = Policy;
  static constexpr int kMaxRegisters = kPass1MaxRegisters;
  static constexpr bool kSplitTile = false;
  using Conv = ChunkConvert<T>;
  static constexpr int L = P::kLanes;
  static constexpr int NR = P::kRowTokens;
  static constexpr int KC = P::kChunksPerLane;
  static constexpr int CE = P::kChunkElems;
  static constexpr int CPT = P::kChunksPerToken;
  /// True when every lane owns real chunks (D a power of two).
  static constexpr bool kAllLanesActive = KC * L == CPT;

  float q[KC][CE];
  float acc[KC][CE];
  float m;
  float l;  // this lane's share until finish(); then the row's total
  float slope2;  // ALiBi slope * log2(e)
  float oscale;  // V1: the sink's rescale of the output (1 unless the sink raises the max; finish)
  float scale2;  // scale * log2(e): logits are kept in base 2 (decode_math.hpp)
  /// The warps' query positions (seq_len - q_len + the row's token): ALiBi and the masks read them
  /// per tile from shared memory (the driver's barrier precedes every consume), so that the kernels
  /// at their register cap keep no register for them.
  __device__ __forceinline__ static int* qpos_table() {
    __shared__ int table[kQposInts];
    return table;
  }
  int j;  // lane within the row
  int z;  // row (token slice) within the warp
  // Byte offsets, inside a stage's K / V part, of this lane's first read (token z*NR, chunk j);
  // every other read is that plus / XOR a compile-time term (decode_policy.hpp: k_read, v_read_*).
  int k_lane;
  int v_lane;

  /// Token (of the row's NR) whose full dot a lane holds after the reduce-scatter: the reversed
  /// bits of the lane's low log2(NR) bits (the scatter halves along offsets 1, 2, 4, ...). Its own
  /// inverse, so it also names the lane holding token i.
  static constexpr int owner(int i) {
    int r = 0;
    for (int b = 1, rb = NR / 2; b < NR; b *= 2, rb /= 2)
      if (i & b) r |= rb;
    return r;
  }

  __device__ __forceinline__ bool lane_chunk_valid(int c) const { return kAllLanesActive || c < CPT; }

  /// The query row of this warp (one warp per row of the block's chunk; DecodeParams::group_size),
  /// or -1.
  __device__ __forceinline__ static int warp_row(const DecodeParams& p) {
    const BlockHeads bh = block_heads(p);
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int v = bh.chunk * p.heads_per_block + warp;
    // Warps past heads_per_block (blocks of small groups have four warps) only copy.
    return warp < p.heads_per_block && v < p.group_size && q_row_real(p, v) ? v : -1;
  }
  /// The query head of this warp's row (warp_row >= 0).
  __device__ __forceinline__ static int warp_head(const DecodeParams& p) {
    return q_row_head(p, block_heads(p).kv_head, warp_row(p));
  }
  /// The q / out row (sequence seq's token of this warp's row): seq * q_len + its token.
  __device__ __forceinline__ static int warp_io_row(const DecodeParams& p, int seq) {
    return seq * p.q_len + q_row_token(p, warp_row(p));
  }

  __device__ __forceinline__ bool init(const DecodeParams& p, int seq, int seq_len) {
    const int v = warp_row(p);
    if (v < 0) return false;
    const int q_head = q_row_head(p, block_heads(p).kv_head, v);
    const int lane = static_cast<int>(threadIdx.x) & 31;
    j = lane % L;
    z = lane / L;
    qpos_table()[static_cast<int>(threadIdx.x) / 32] = math::row_len(seq_len, p.q_len, q_row_token(p, v)) - 1;
    scale2 = p.scale * math::kLog2e;
    slope2 = (p.alibi_slopes != nullptr ? p.alibi_slopes[q_head] : 0.0f) * math::kLog2e;
    m = math::neg_inf();
    l = 0.0f;
    k_lane = k_read_base<P, kLayout>(z, j);
    v_lane = v_read_base<P, kLayout>(z, j);
    const T* qrow = static_cast<const T*>(p.q) + static_cast<int64_t>(seq * p.q_len + q_row_token(p, v)) * p.q_stride + static_cast<int64_t>(q_head) * D;
#pragma unroll
    for (int k = 0; k < KC; ++k) {
      const int c = j + k * L;
#pragma unroll
      for (int e = 0; e < CE; ++e) q[k][e] = acc[k][e] = 0.0f;
      if (lane_chunk_valid(c)) Conv::unpack(__ldg(reinterpret_cast<const uint4*>(qrow + c * CE)), q[k]);
    }
    return true;
  }

  /// Folds tile tokens [z*NR, (z+1)*NR) (absolute positions tile_start + ...) into the state;
  /// tokens outside the row's window or after its query and, kMasked (the tail's tiles),
  /// at or past `end` weigh 0. sk / sv: shared addresses of the stage's K and V
  /// parts (kStageAlign-aligned).
  template <bool kMasked>
  __device__ __forceinline__ void consume(const DecodeParams& p, dev::SmemAddr sk, dev::SmemAddr sv, int tile_start, int end) {
    const int t0 = z * NR;
    const dev::SmemAddr kb = sk + k_lane;
    const dev::SmemAddr vb = sv + v_lane;

    // q . k for the row's NR tokens, over this lane's chunks.
    float dot[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      float d = 0.0f;
#pragma unroll
      for (int k = 0; k < KC; ++k) {
        if (lane_chunk_valid(j + k * L)) {
          float kv[CE];
          Conv::unpack(dev::lds16(k_read<P, kLayout>(kb, i, k)), kv);
#pragma unroll
          for (int e = 0; e < CE; ++e) d = fmaf(q[k][e], kv[e], d);
        }
      }
      dot[i] = d;
    }

    // Reduce-scatter over the row: each step halves the values a lane holds and sends the other
    // half to its partner, so after log2(NR) steps every lane holds one token's sum over the NR
    // lanes of its group; the remaining offsets (NR .. L/2) finish the sum over the row.
#pragma unroll
    for (int s = 0; (1 << s) < NR; ++s) {
      const int o = 1 << s;
      const int n = NR >> (s + 1);
      const bool upper = (j & o) != 0;
#pragma unroll
      for (int i = 0; i < n; ++i) {
        const float send = upper ? dot[i] : dot[i + n];
        const float keep = upper ? dot[i + n] : dot[i];
        dot[i] = keep + __shfl_xor_sync(kFullMask, send, o);
      }
    }
#pragma unroll
    for (int o = NR; o < L; o *= 2) dot[0] += __shfl_xor_sync(kFullMask, dot[0], o);

    // Logit of this lane's token (the one place a logit is formed and masked), the tile max over
    // the row, the online-softmax step (one -inf guard for the row), the weight.
    const int pos = tile_start + t0 + owner(j & (NR - 1));
    const int rel = pos - qpos_table()[static_cast<int>(threadIdx.x) / 32];
    float s = math::logit2(dot[0], scale2, slope2 * static_cast<float>(rel));  // math::alibi_bias2
    if (p.cap2 > 0.0f) s = softcap2_dev(s, p.cap2, p.cap2_k);  // after scale and bias, before the masks
    // Every tile: outside the row's window and after its query (q_len > 1), one compare.
    if ((kMasked && pos >= end) || !math::attends(rel, p.window_span)) s = math::neg_inf();
    float tile_max = s;
#pragma unroll
    for (int o = 1; o < NR; o *= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, o));
    const math::MaxStep st = math::online_max2(m, tile_max);
    const float f = st.moved ? dev::ex2(m - st.sub) : 1.0f;
    m = st.m;
    const float w = dev::ex2(s - st.sub);
    l = l * f + w;
#pragma unroll
    for (int k = 0; k < KC; ++k)
#pragma unroll
      for (int e = 0; e < CE; ++e) acc[k][e] *= f;

    // acc += p * v, tokens in order; p of token i comes from lane owner(i) of the row.
    if constexpr (kLayout == KVLayout::kNHD) {
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        const float pi = __shfl_sync(kFullMask, w, owner(i), L);
#pragma unroll
        for (int k = 0; k < KC; ++k) {
          if (lane_chunk_valid(j + k * L)) {
            float vv[CE];
            Conv::unpack(dev::lds16(v_read_nhd<P>(vb, i, k)), vv);
#pragma unroll
            for (int e = 0; e < CE; ++e) acc[k][e] = fmaf(pi, vv[e], acc[k][e]);
          }
        }
      }
    } else {
      // d-major V: one chunk holds CE consecutive tokens of one d.
#pragma unroll
      for (int g = 0; g < NR / CE; ++g) {
        float pk[CE];
#pragma unroll
        for (int i = 0; i < CE; ++i) pk[i] = __shfl_sync(kFullMask, w, owner(g * CE + i), L);
#pragma unroll
        for (int k = 0; k < KC; ++k) {
          if (lane_chunk_valid(j + k * L)) {
#pragma unroll
            for (int e = 0; e < CE; ++e) {
              float vv[CE];
              Conv::unpack(dev::lds16(v_read_vllm<P>(vb, g, k, e)), vv);
#pragma unroll
              for (int i = 0; i < CE; ++i) acc[k][e] = fmaf(pk[i], vv[i], acc[k][e]);
            }
          }
        }
      }
    }
  }

  /// Nothing: consume folds whole tiles (kSplitTile false).
  __device__ __forceinline__ void accumulate(dev::SmemAddr) {}
  __device__ __forceinline__ void ready(const DecodeParams&) {}  // init loaded q into registers

  /// Sums l over the row and merges the warp's Z slices (fixed butterfly: deterministic). Every
  /// lane then holds the head's state for its chunks; V1 adds the head's sink to l.
  __device__ __forceinline__ void finish(const DecodeParams& p) {
#pragma unroll
    for (int o = 1; o < NR; o *= 2) l += __shfl_xor_sync(kFullMask, l, o);
#pragma unroll
    for (int o = L; o < 32; o *= 2) {
      const float mo = __shfl_xor_sync(kFullMask, m, o);
      const float lo = __shfl_xor_sync(kFullMask, l, o);
      const math::MergeFactors mf = math::merge_factors2(m, mo);
      l = l * mf.fa + lo * mf.fb;
#pragma unroll
      for (int k = 0; k < KC; ++k)
#pragma unroll
        for (int e = 0; e < CE; ++e) {
          const float ao = __shfl_xor_sync(kFullMask, acc[k][e], o);
          acc[k][e] = acc[k][e] * mf.fa + ao * mf.fb;
        }
      m = mf.m;
    }
    // NOTE(graph): the sink is read from memory. V2's partials leave it to the merge.
    oscale = 1.0f;
    if (!p.write_partials && p.sinks != nullptr) {
      // static-report: begin sinks
      const math::SinkFold sf = math::sink_fold2(__ldg(p.sinks + warp_head(p)), m, 0.0f);
      l = l * sf.f + sf.term;  // f = 1 (exact) unless the sink raises the row's max
      oscale = sf.f;           // then the output is rescaled too (write)
      // static-report: end sinks
    }
  }

  /// After finish (poison_edge): the warp's row becomes NaN where pred(its query position) holds.
  template <class F>
  __device__ __forceinline__ void poison_rows(const DecodeParams&, int, F&& pred) {
    if (pred(qpos_table()[static_cast<int>(threadIdx.x) / 32])) l = bits_float(0x7fc00000u);
  }

  /// Slice 0 writes: V1 the normalised output row, V2 the partial (m, l, acc / l).
  __device__ __forceinline__ void write(const DecodeParams& p, int seq, int part) const {
    if (z != 0) return;
    const int q_head = warp_head(p);
    if (p.write_partials) {
      // static-report: begin v2-write
      const int64_t idx = math::partial_index(warp_io_row(p, seq), q_head, part, p.num_q_heads, p.max_partitions);
      if (j == 0) {
        p.max_logits[idx] = m * math::kLn2;  // back to natural logits for the merge
        p.exp_sums[idx] = l;
      }
      float* dst = p.partial_out + idx * D;
#pragma unroll
      for (int k = 0; k < KC; ++k) {
        const int c = j + k * L;
        if (!lane_chunk_valid(c)) continue;
#pragma unroll
        for (int e = 0; e < CE; e += 4) {
          float4 o;
          o.x = math::normalise(acc[k][e + 0], l);
          o.y = math::normalise(acc[k][e + 1], l);
          o.z = math::normalise(acc[k][e + 2], l);
          o.w = math::normalise(acc[k][e + 3], l);
          *reinterpret_cast<float4*>(dst + c * CE + e) = o;
        }
      }
      // static-report: end v2-write
    } else {
      // static-report: begin v1-write
      T* dst = static_cast<T*>(p.out) + static_cast<int64_t>(warp_io_row(p, seq)) * p.out_stride + static_cast<int64_t>(q_head) * D;
#pragma unroll
      for (int k = 0; k < KC; ++k) {
        const int c = j + k * L;
        if (!lane_chunk_valid(c)) continue;
        float o[CE];
#pragma unroll
        for (int e = 0; e < CE; ++e) o[e] = math::normalise(acc[k][e], l) * oscale;
        *reinterpret_cast<uint4*>(dst + c * CE) = Conv::pack(o);
      }
      // static-report: end v1-write
    }
  }
};

// ---------------------------------------------------------------- edge tiles
// Bytes a row reads but does not attend (docs/design.md, "Bytes a row reads but does not attend").
// A block reads whole tiles, and inside them some positions are masked for some of its rows: those
// before the last row's window (lead_end) and, with q_len > 1, those after the first row's query
// (tail_start). Their weights are exactly 0, but 0 x inf = NaN in the p.v of both maths, so a
// non-finite V value there (a window's edge block, a stale or garbage draft) would turn the rows
// that mask it into NaN. Two places handle them, both outside the main loop:
//   - the lead's tiles (at most three, all issued by the prologue) are scanned in shared memory
//     before the loop: non-finite V values at masked positions are zeroed, their positions marked
//     (sanitize_edge);
//   - the tail's tiles (the last tile, and with q_len > 1 those holding the drafts: at most three)
//     run after the loop, masked; once they have all landed, the same scan runs on the drafts'
//     positions in them.
// After the loop a row that attends a marked position becomes NaN (poison_edge). So a row that
// attends no inf or NaN keeps its bits, and one that attends one is not finite.

/// The positions some row of a sequence of `len` tokens masks inside what its blocks read.
struct EdgeBounds {
  int lead_end;    // positions < lead_end lie before the last row's window (0: no window)
  int tail_start;  // positions >= tail_start lie after the first row's query (INT_MAX: q_len 1)
};
__device__ __forceinline__ EdgeBounds edge_bounds(const DecodeParams& p, int len) {
  return EdgeBounds{math::window_first(len, p.window), p.q_len > 1 ? len - p.q_len + 1 : INT_MAX};
}

/// The block's edge state in shared memory, not registers (the kernels at their register caps have
/// none to spare across the main loop): [0] set when a position was marked (block-uniform after
/// the next barrier), [1] the sequence's clamped length, [2] lead_end, [3] tail_start, [4] the
/// first position of the tail's tiles, [5] the block's first position (`start`).
__device__ __forceinline__ int* edge_state() {
  __shared__ int state[kEdgeStateInts];
  return state;
}
/// Positions whose V held a non-finite value: [pos - start] before lead_end (fewer than 64: start
/// is the tile of row 0's window start, at most NTOK - 1 + 15 before lead_end), [kEdgeLeadMarks +
/// pos - the tail's first position] in the tail's S - 1 tiles (at most 96 positions). Every writer
/// stores 1, so concurrent writers need no atomics. Sizes: decode_policy.hpp.
__device__ __forceinline__ unsigned char* edge_marks() {
  static_assert(kEdgeMarks % 4 == 0, "zeroed as words");
  __shared__ __align__(4) unsigned char marks[kEdgeMarks];
  return marks;
}
/// Raw bits of a cache element that is an inf or a NaN (fp8 E4M3: its NaN codes; E5M2: inf and NaN).
template <typename KV>
__device__ __forceinline__ bool nonfinite_bits(uint32_t b) {
  if constexpr (std::is_same_v<KV, __half>) return (b & 0x7c00u) == 0x7c00u;
  if constexpr (std::is_same_v<KV, __nv_bfloat16>) return (b & 0x7f80u) == 0x7f80u;
  if constexpr (std::is_same_v<KV, __nv_fp8_e4m3>) return (b & 0x7fu) == 0x7fu;
  if constexpr (std::is_same_v<KV, __nv_fp8_e5m2>) return (b & 0x7cu) == 0x7cu;
  return (b & 0x7f800000u) == 0x7f800000u;
}
/// Edge positions [lo, hi) of the block's tiles (landed and published; stage_v(u): tile u's V part):
/// zeroes their non-finite V values, marks those positions and sets edge_state()[0]. Every thread
/// takes part; the caller's barrier publishes the stores.
template <typename KV, int D, KVLayout kLayout, class P, class StageV>
__device__ __forceinline__ void sanitize_edge(int lo, int hi, StageV stage_v) {
  constexpr int CE = P::kChunkElems;
  constexpr int NTOK = P::kTileTokens;
  const int start = edge_state()[5];
  // Positions one at a time (block-uniform), d spread over the threads: few registers beside the
  // math's state, which is live here (the kernels sit at their register caps).
#pragma unroll 1
  for (int pos = lo; pos < hi; ++pos) {
    const int t = (pos - start) % NTOK;  // the token within its tile
    char* const sv = stage_v((pos - start) / NTOK);
#pragma unroll 1
    for (int d = static_cast<int>(threadIdx.x); d < D; d += static_cast<int>(blockDim.x)) {
      // NHD: chunk d / CE of token t; vLLM: tokens t / CE * CE .. + CE - 1 of d.
      const int at = 16 * (kLayout == KVLayout::kNHD ? smem_pos_nhd<P>(t, d / CE) : smem_pos_vllm_v<P>(d, t / CE)) +
                     static_cast<int>(sizeof(KV)) * (kLayout == KVLayout::kNHD ? d % CE : t % CE);
      Bits<KV>* v = reinterpret_cast<Bits<KV>*>(sv + at);
      if (!nonfinite_bits<KV>(*v)) continue;
      *v = 0;
      edge_state()[0] = 1;
      if (pos < edge_state()[2]) edge_marks()[pos - start] = 1;
      if (pos >= edge_state()[3]) edge_marks()[kEdgeLeadMarks + pos - edge_state()[4]] = 1;
    }
  }
}

/// After the loop (edge_state()[0] set): each row that attends a marked position of [start, end)
/// becomes NaN (M::poison_rows: the thread's rows by their query positions).
template <class M>
__device__ __forceinline__ void poison_edge(const DecodeParams& p, M& math, int end) {
  const int start = edge_state()[5];
  const int lead_hi = cmin(edge_state()[2], end);
  const int tail0 = edge_state()[4];
  math.poison_rows(p, edge_state()[1], [&](int qpos) {
    bool hit = false;
    for (int pos = start; pos < lead_hi; ++pos)
      hit |= edge_marks()[pos - start] && math::attends(pos - qpos, p.window_span);
    for (int pos = tail0; pos < end; ++pos)
      hit |= edge_marks()[kEdgeLeadMarks + pos - tail0] && math::attends(pos - qpos, p.window_span);
    return hit;
  });
}

// ---------------------------------------------------------------- device body

/// The pass-1 kernel's static shared memory (P::kSmemBytes), one array: the S stages
/// (kStageAlign-aligned, the swizzles XOR into their addresses), the math's exchange buffer
/// (P::kExchangeBytes; none for the CUDA-core math), the block-id table. One array, so that the
/// stages' alignment costs no padding whatever the compiler's placement of arrays.
template <class P>
__device__ __forceinline__ char* pass1_shared() {
  static_assert(P::kSmemBytes % 16 == 0, "whole 16-byte chunks");
  __shared__ __align__(P::kStageAlign) uint4 s_pass1[P::kSmemBytes / 16];
  return reinterpret_cast<char*>(s_pass1);
}
template <class P>
__device__ __forceinline__ char* pass1_exchange() {
  return pass1_shared<P>() + P::kStages * P::kStageBytes;
}

template <typename T, typename KV, int D, KVLayout kLayout, template <typename, typename, int, KVLayout> class Math>
__device__ __forceinline__ void paged_decode_body(const DecodeParams& p) {
  using M = Math<T, KV, D, kLayout>;
  using P = typename M::Policy;
  constexpr int S = P::kStages;
  constexpr int NTOK = P::kTileTokens;
  constexpr int NSEG = P::kMaxSegments;
  constexpr int kStageChunks = 2 * P::kOperandChunks;
  static_assert(S >= 3, "a split math waits for tile t+1 with S-3 groups in flight");

  char* const stages = pass1_shared<P>();
  int32_t* const s_seg = reinterpret_cast<int32_t*>(pass1_exchange<P>() + P::kExchangeBytes);

  const int part = blockIdx.x;
  const int seq = blockIdx.z;
  const int kv_head = block_heads(p).kv_head;

  // NOTE(graph): the length is read from device memory at a fixed address; the grid is sized for
  // max_seq_len. These exits depend only on block indices and seq_lens, so they are block-uniform
  // and happen before any barrier. A padded row (length 0) writes nothing; a V2 partition at or past
  // the length writes nothing either, because the merge reads only live partitions.
  int len = p.seq_lens[seq];
  len = len < p.max_seq_len ? len : p.max_seq_len;  // never read past the block table row
  if (len <= 0) return;
  // A window's partitions start at its first block: blocks before it are never read (neither table
  // entry nor data), and the block's positions before the window are masked (`first`).
  // Row 0's window (read_window): the other rows mask more (their own lo).
  const int first = math::window_first(len, p.read_window);
  const int64_t start64 = math::window_origin(len, p.read_window, p.block_size) + static_cast<int64_t>(part) * p.partition_size;
  if (start64 >= len) return;
  const int end = static_cast<int>(start64 + p.partition_size < len ? start64 + p.partition_size : len);
  // Tiles wholly before the window (tiles shorter than a block) are skipped: at most one tile then
  // holds positions before `first`, so the masked lead is one step, not a loop beside the main one.
  // NTOK-aligned inside the block, as every tile start is when a tile is shorter than a block.
  int start = static_cast<int>(start64);
  if (first > start) start += (first - start) / NTOK * NTOK;

  const int tid = static_cast<int>(threadIdx.x);
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.block_table_stride;

  // The edge state first, before the math's registers fill (published by the prologue's barrier).
  const int ntiles = (end - start + NTOK - 1) / NTOK;
  // One word per thread, not a byte loop (~60 instructions in every block's prologue): every
  // pass-1 block has at least 128 threads (pass1_threads_for).
  static_assert(kEdgeMarks / 4 <= 128, "one word per thread");
  if (tid < kEdgeMarks / 4) reinterpret_cast<uint32_t*>(edge_marks())[tid] = 0;
  if (tid == 0) {
    const EdgeBounds eb = edge_bounds(p, len);
    int* es = edge_state();
    es[0] = 0;
    es[1] = len;
    es[2] = eb.lead_end;
    es[3] = eb.tail_start;
    // The tail: the last S - 1 = 3 tiles, all in flight once the loop has issued its last; the
    // drafts after the first row's query (at most 15 positions) and the end lie within them.
    es[4] = start + cmax(0, ntiles - (S - 1)) * NTOK;
    es[5] = start;
  }
  const TileLoader<KV, D, kLayout, P> loader(p, kv_head);
  M math;
  // Warp-uniform. Warps that take no part (CUDA-core math: past the chunk's heads) only copy.
  const bool active = math.init(p, seq, len);

  const int nseg = loader.segments();
  auto stage_k = [&](int t) { return stages + (t % S) * (kStageChunks * 16); };
  auto stage_v = [&](int t) { return stages + (t % S) * (kStageChunks * 16) + P::kOperandChunks * 16; };

  // Prologue: segment offsets of tiles 0 .. S-1, then tiles 0 .. S-2 in flight (one group each,
  // empty groups included, so that group counting is the same for every thread and length).
  using Loader = TileLoader<KV, D, kLayout, P>;
  // static-report: begin tiles
  if (tid < nseg) {
    Loader::bad_table()[tid] = 0;
    for (int t = 0; t < S && t < ntiles; ++t) {
      const int ts = start + t * NTOK;
      s_seg[(t % S) * NSEG + tid] = loader.clamp_id(p, loader.load_id(table, ts, end, tid), loader.segment_index(ts, tid));
    }
  }
  __syncthreads();
  math.ready(p);  // every thread: what init staged in shared memory is visible now
  for (int t = 0; t < S - 1; ++t) {
    if (t < ntiles) loader.issue(stage_k(t), stage_v(t), s_seg + (t % S) * NSEG, start + t * NTOK, end);
    dev::cp_async_commit();
  }
  // static-report: end tiles

  // ------------------------------------------------ edge tiles before the loop
  // The tiles holding positions before the last row's window (at most three: row 0's window starts
  // in tile 0, and q_len - 1 <= 15 more positions follow) are among those the prologue issued: they
  // are sanitized here, before any math reads them, so the main loop has no edge code.
  const int t_lead = [&] {
    const int lead_end = edge_state()[2];  // published by the prologue's barrier
    return lead_end > start ? cmin(ntiles, (lead_end - start + NTOK - 1) / NTOK) : 0;
  }();
  static_assert(S - 1 >= 3, "the lead's edge tiles are among the prologue's");
  if (t_lead > 0) {  // block-uniform
    // static-report: begin edge
    dev::cp_async_wait<0>();
    __syncthreads();
    sanitize_edge<KV, D, kLayout, P>(start, cmin(edge_state()[2], end), stage_v);
    __syncthreads();
    // static-report: end edge
  }

  // ------------------------------------------------ main loop over tiles (block-uniform bounds)
  // One tile t per step. A whole-tile math (kSplitTile false): wait for tile t, one barrier
  // (everyone's copies landed; everyone is done with tile t-1, whose stage is refilled), issue tile
  // t+S-1, compute tile t. A split math: consume(t) (with its own barrier inside), wait for tile
  // t+1, one barrier (tile t+1 landed; what consume(t) stored is visible; everyone is done with
  // tile t-1's stage: its V was read before consume(t)'s barrier), issue tile t+S-1 into that
  // stage, accumulate(t). The loop stops where the tail (edge_state()[4]) begins, S - 1 tiles
  // before the end: every tile it issues (t + S - 1) exists, it fetches the ids of tile t + S while
  // t + 1 < t_tail, so t_tail is its one bound, and it never masks past the end. The tail's tiles
  // run after it, masked, with nothing left to issue.
  const int t_tail = cmax(0, ntiles - (S - 1));
  auto step = [&](int t, auto last) {
    constexpr bool kIssue = !decltype(last)::value;  // the tail has nothing left to issue
    const int tn = t + S - 1;
    if constexpr (!M::kSplitTile) {
      dev::cp_async_wait<S - 2>();  // this thread's copies of tile t have landed
      __syncthreads();
      if constexpr (kIssue) loader.issue(stage_k(tn), stage_v(tn), s_seg + (tn % S) * NSEG, start + tn * NTOK, end);
      dev::cp_async_commit();  // empty in the tail: the waits count groups
    }
    // Block ids of tile t+S: loaded now, stored after the math so the load's latency hides behind
    // it. Slot (t+S) % S held tile t's offsets, whose copies were issued S-1 iterations ago.
    const int tf = t + S;
    const bool fetch = kIssue && tid < nseg && t + 1 < t_tail;  // tf < ntiles
    const int32_t id = fetch ? loader.load_id(table, start + tf * NTOK, end, tid) : 0;
    if (active) math.template consume<decltype(last)::value>(p, dev::smem_addr(stage_k(t)), dev::smem_addr(stage_v(t)), start + t * NTOK, end);
    if constexpr (M::kSplitTile) {
      dev::cp_async_wait<S - 3>();  // this thread's copies of tile t+1 have landed
      __syncthreads();
      if constexpr (kIssue) loader.issue(stage_k(tn), stage_v(tn), s_seg + (tn % S) * NSEG, start + tn * NTOK, end);
      dev::cp_async_commit();  // empty in the tail: the waits count groups
      if (active) math.accumulate(dev::smem_addr(stage_v(t)));
    }
    if (fetch) s_seg[(tf % S) * NSEG + tid] = loader.clamp_id(p, id, loader.segment_index(start + tf * NTOK, tid));
  };
  if constexpr (M::kSplitTile) {
    dev::cp_async_wait<S - 2>();  // tile 0
    __syncthreads();
  }
  int t = 0;
  for (; t < t_tail; ++t) step(t, std::false_type{});  // the main loop
  // The tail's edge positions (after the first row's query, q_len > 1) are sanitized once its
  // tiles have landed (all in flight: the loop issued the last), before their math reads them.
  if (edge_state()[3] < end) {  // block-uniform
    // static-report: begin edge
    dev::cp_async_wait<0>();
    __syncthreads();
    sanitize_edge<KV, D, kLayout, P>(cmax(edge_state()[3], start), end, stage_v);
    __syncthreads();
    // static-report: end edge
  }
  for (const int n = (end - start + NTOK - 1) / NTOK; t < n; ++t) step(t, std::true_type{});  // the tail, masked
  if (tid < nseg) Loader::report_bad_block(p, seq, Loader::bad_table()[tid]);

  if (!active) return;  // no barrier below
  math.finish(p);
  if (edge_state()[0]) {  // block-uniform
    // static-report: begin edge
    poison_edge(p, math, end);
    // static-report: end edge
  }
  math.write(p, seq, part);
}

// ---------------------------------------------------------------- kernel

template <typename T, typename KV, int D, KVLayout kLayout, template <typename, typename, int, KVLayout> class Math>
__global__ void __maxnreg__((Math<T, KV, D, kLayout>::kMaxRegisters))
    PagedDecodeKernel(const __grid_constant__ DecodeParams p) {
  // PDL (kernel_launch.cuh; docs/design.md, "The graph contract"): q (the caller's projection), the
  // cache (the append), lengths and tables (the staging copies) may still be being written, and the
  // previous merge may still read the workspace we write: wait before the body's first global
  // access (seq_lens, at its top). Every block waits, even one that exits at once, so this grid
  // never completes before its predecessor. The trigger then takes effect once every block has
  // issued it, i.e. when the grid's last block is resident: the dependents' blocks take only the SM
  // room our grid no longer needs, and park at their own wait until we are done.
  dev::grid_dependency_wait();
  dev::launch_dependents();
  paged_decode_body<T, KV, D, kLayout, Math>(p);
}

// ---------------------------------------------------------------- launchers

/// Launches the pass-1 kernel of one math over grid (partitions, kv_heads x head chunks, seqs);
/// p's derived fields are set (launch_paged_decode).
template <typename T, typename KV, int D, KVLayout kLayout, template <typename, typename, int, KVLayout> class Math>
void enqueue_paged_decode(const DecodeParams& p, int threads, cudaStream_t stream, const char* name) {
  const dim3 grid(static_cast<unsigned>(p.write_partials ? p.max_partitions : 1),
                  static_cast<unsigned>(p.num_kv_heads * p.head_chunks), static_cast<unsigned>(p.num_seqs));
  launch_kernel(PagedDecodeKernel<T, KV, D, kLayout, Math>, grid, dim3(static_cast<unsigned>(threads)), stream,
                p.programmatic, p, name);
}

/// cudaOccupancyMaxActiveBlocksPerMultiprocessor of one math's kernel at `threads`, no dynamic
/// shared memory (what enqueue_paged_decode launches).
template <typename T, typename KV, int D, KVLayout kLayout, template <typename, typename, int, KVLayout> class Math>
int paged_decode_kernel_blocks_per_sm(int threads) {
  int blocks = 0;
  DG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, PagedDecodeKernel<T, KV, D, kLayout, Math>,
                                                              threads, 0));
  return blocks;
}

template <typename T, typename KV, int D, KVLayout kLayout>
int paged_decode_blocks_per_sm(int group_size) {
  if constexpr (sizeof(KV) == 1) {
    return paged_decode_tc_blocks_per_sm<T, KV, D, kLayout>();
  } else {
    if constexpr (sizeof(T) == 2) {
      if (pass1_uses_tensor_cores(sizeof(T), group_size)) return paged_decode_tc_blocks_per_sm<T, KV, D, kLayout>();
    }
    return paged_decode_kernel_blocks_per_sm<T, KV, D, kLayout, CudaCoreMath>(pass1_threads_for(sizeof(T), group_size));
  }
}

/// The single dispatch of the pass-1 math: the tensor-core math (inst/decode_tc_*.cu) for fp16 /
/// bf16 with groups of 4 or more and for fp8 caches at every group (inst/decode_fp8*.cu, which
/// instantiate this launcher with the tensor-core math in the same file), the CUDA-core math
/// otherwise (pass1_uses_tensor_cores).
template <typename T, typename KV, int D, KVLayout kLayout>
void launch_paged_decode(DecodeParams p, cudaStream_t stream) {
  p.q_group = p.num_q_heads / p.num_kv_heads;
  p.group_size = pass1_rows(p.q_group, p.q_len);  // rows per KV head: the math and block shape follow them
  p.q_shift = p.q_len > 1 ? ilog2(next_pow2(p.q_group)) : 31;
  p.q_mask = p.q_len > 1 ? next_pow2(p.q_group) - 1 : -1;
  p.head_chunks = pass1_head_chunks_for(p.group_size);
  p.head_chunks_magic = small_div_magic(p.head_chunks);
  p.heads_per_block = pass1_heads_per_block_for(p.group_size);
  p.block_size_log2 = ilog2(p.block_size);
  const bool tensor_cores = pass1_uses_tensor_cores(sizeof(KV), p.group_size);
  // Grid y and z are limited to 65535 blocks (num_seqs: validate_decode_args, kMaxSeqsPerLaunch).
  require(p.num_seqs <= 65535, "num_seqs", p.num_seqs, "at most 65535 per launch");
  require(static_cast<int64_t>(p.num_kv_heads) * p.head_chunks <= 65535, "num_kv_heads", p.num_kv_heads,
          "at most 65535 / head chunks per launch");
  const char* name = p.write_partials ? (tensor_cores ? "PagedDecodeKernel (V2 pass 1) on tensor cores"
                                                      : "PagedDecodeKernel (V2 pass 1)")
                                      : (tensor_cores ? "PagedDecodeKernel (V1) on tensor cores"
                                                      : "PagedDecodeKernel (V1)");
  if (fault::should_fail(fault::Site::kKernelLaunch))
    fault::throw_injected(fault::Site::kKernelLaunch, std::string("launch of ") + name);
  if constexpr (sizeof(KV) == 1) {
    return enqueue_paged_decode_tc<T, KV, D, kLayout>(p, stream, name);
  } else {
    if constexpr (sizeof(T) == 2) {
      if (tensor_cores) return enqueue_paged_decode_tc<T, KV, D, kLayout>(p, stream, name);
    }
    enqueue_paged_decode<T, KV, D, kLayout, CudaCoreMath>(p, pass1_threads_for(sizeof(T), p.group_size), stream, name);
  }
}

}  // namespace decodegraph::kernels
