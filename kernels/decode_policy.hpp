// Tuning policy and shared-memory layout of the pass-1 kernel (kernels/paged_decode.cuh), as
// constexpr code that also compiles on the host: the launcher, the occupancy model, the tests (which
// check the layouts for bank conflicts) and the static report tool all read the same numbers.
//
// Vocabulary (docs/kernels.md has the full picture):
//   chunk   16 bytes: CE = 16 / sizeof(T) elements, the unit of every global and shared access
//   row     the L lanes of a warp that share one query head and one token slice
//   slice   Z = 32 / L rows per warp; slice z takes tokens [z*NR, (z+1)*NR) of each tile
//   tile    NTOK = Z * NR tokens of K and V (one pipeline stage); S stages in flight
//   segment the part of a tile that lies in one cache block: TB = min(block_size, NTOK) tokens
#pragma once

#include <cstdint>
#include <type_traits>

#include "decodegraph/numeric.hpp"  // DG_HD
#include "decodegraph/types.hpp"

namespace decodegraph::kernels {

// ---------------------------------------------------------------- constexpr helpers

constexpr int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}
constexpr int cmax(int a, int b) { return a > b ? a : b; }

/// m = ceil(2^32 / d) for 1 <= d < 2^16: then y / d = (y m) >> 32 exactly for every y < 2^16
/// (m d - 2^32 < d, so y (m d - 2^32) < 2^32 cannot carry past the quotient). A block's heads
/// follow from grid y this way: a runtime division is ~20 instructions in every block.
constexpr uint64_t small_div_magic(int d) {
  return ((uint64_t{1} << 32) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d);
}
/// y / d for 0 <= y < 2^16 and 1 <= d < 2^16, with m = small_div_magic(d).
constexpr int small_div(int y, uint64_t m) {
  return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(y)) * m) >> 32);
}
constexpr int cmin(int a, int b) { return a < b ? a : b; }
constexpr int ilog2(int v) {  // floor(log2(v)) for v >= 1
  int r = 0;
  while ((1 << (r + 1)) <= v) ++r;
  return r;
}
constexpr bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

// ---------------------------------------------------------------- policy

/// Register cap of the pass-1 kernel (__maxnreg__). 80 keeps every instantiation spill-free (ptxas
/// left alone takes 70-96 for bf16) and costs no occupancy where it matters: at <= 4 warps shared
/// memory limits a block to 6 per SM anyway, and 8 warps fit 3 per SM at 72 as at 80. 64 spills.
inline constexpr int kPass1MaxRegisters = 80;

/// Pass 1's static shared memory beside the policy's one array (paged_decode.cuh): the edge tiles'
/// marks (kEdgeMarks bytes: kEdgeLeadMarks lead positions, then the tail's) and state
/// (kEdgeStateInts), the loader's clamped-id record (kMaxSegments ints), and on the CUDA-core math
/// the rows' query positions (kQposInts). ptxas packs them after the array, unpadded
/// (bench/results/static/after-fixed.json; Occupancy.ModelMatchesTheStaticReport checks every kernel).
inline constexpr int kEdgeLeadMarks = 64;
inline constexpr int kEdgeMarks = kEdgeLeadMarks + 96;
inline constexpr int kEdgeStateInts = 6;
inline constexpr int kQposInts = 32;
constexpr int pass1_side_smem(int max_segments, bool cuda_core) {
  return kEdgeMarks + 4 * (kEdgeStateInts + max_segments + (cuda_core ? kQposInts : 0));
}

/// Register cap of the tensor-core pass-1 kernel per (head size, layout): the lowest of 80, 96 and
/// 128 at which ptxas (nvcc 13.0, sm_90) spills nothing for every head size of the layout (at 80
/// the vLLM kernels spill 8-32 bytes at heads 64-192, some of them only as the code around them
/// changes; at 96 the head-256 kernels spill). A 128-thread block fits 6
/// per SM at 80 registers, 5 at 96 and 4 at 128 (shared memory allows 6); even 4 keep two 6-8 KB
/// tiles in flight each. The vLLM loader keeps more per-slot state than NHD's (separate K and V
/// chunk geometry).
/// fp8 caches (fp8 = true): the lowest caps at which ptxas (nvcc 13.0, sm_90) spills nothing for
/// either layout, plus a step of margin where it costs no block: their 16-token tiles at D >= 192
/// split the k-steps over two warps, not four, so a lane keeps twice the q registers (24 / 32), and
/// the fragments convert. D <= 128: 96 (88 spills at D 112), 5 blocks per SM; D 192: 128 (112
/// spills), 4 blocks as at 120; D 256: 160 (144 is the vLLM kernel's use; 128 spills), 3 blocks as
/// at 144.
constexpr int tc_pass1_max_registers(int d, KVLayout layout, bool fp8 = false) {
  // fp8 vLLM D 112: 104 (4 blocks per SM, not 5) since the edge tiles (issue 39): at 96 ptxas put
  // an 8-byte spill into its main loop in every variant tried.
  if (fp8 && d == 112 && layout == KVLayout::kVLLM) return 104;
  if (fp8) return d <= 128 ? 96 : d == 192 ? 128 : 160;
  if (d == 256) return 128;
  // NHD head 192: 88 (5 blocks per SM, as the vLLM layout's) since the q_len rows (issue 18): at
  // 80 ptxas spilled one register around the main loop whatever was moved.
  if (layout == KVLayout::kNHD && d == 192) return 88;
  return layout == KVLayout::kNHD ? 80 : 96;
}

/// Pass-1 policy for element size kElemBytes (2: fp16/bf16, 4: fp32) and head size D.
/// Untuned on hardware (no GPU was available): the values follow the design in docs/kernels.md.
template <int kElemBytes, int D>
struct Pass1Policy {
  /// Elements per 16-byte chunk (the vLLM layout's x).
  static constexpr int kChunkElems = 16 / kElemBytes;
  /// Chunks of one token's K (or V) row.
  static constexpr int kChunksPerToken = D / kChunkElems;
  static constexpr int kDPad = next_pow2(D);
  /// Head-dimension elements a lane owns: kChunksPerLane chunks c = j + k * kLanes (k < KC), so the
  /// lanes of a row read consecutive chunks (conflict-free) whatever KC is.
  static constexpr int kVec = cmax(kChunkElems, kDPad / 32);
  static constexpr int kChunksPerLane = kVec / kChunkElems;
  /// Lanes per row (power of two); lanes whose chunk is >= kChunksPerToken idle (D = 80, 96, ...).
  static constexpr int kLanes = kDPad / kVec;
  /// Token slices per warp. One warp serves one query head.
  static constexpr int kSlices = 32 / kLanes;
  /// Tokens per row per tile (NR): the reduce-scatter of the dot products runs over NR tokens.
  /// 8 everywhere except fp32 at D > 128, where 4 keeps a stage at <= 8 KB.
  static constexpr int kRowTokens = (kElemBytes == 4 && D > 128) ? 4 : 8;
  /// Tokens per tile (one pipeline stage).
  static constexpr int kTileTokens = kSlices * kRowTokens;
  /// Pipeline depth: tiles t+1 .. t+S-1 load while tile t is computed. 4 x <= 8 KB keeps the static
  /// shared memory under 48 KB (no opt-in attribute, so the eager launchers need no initialisation)
  /// and up to 24 KB per block in flight.
  static constexpr int kStages = 4;
  /// Chunks of one operand (K or V) per tile.
  static constexpr int kTileChunks = kTileTokens * kChunksPerToken;
  static constexpr int kStageBytes = 2 * kTileChunks * 16;  // K + V
  /// vLLM V tiles are d-major: kVGroups chunks (of CE consecutive tokens) per head-dimension row.
  static constexpr int kVGroups = kTileTokens / kChunkElems;
  /// Segments per tile at most (block_size >= 8).
  static constexpr int kMaxSegments = cmax(1, kTileTokens / 8);
  /// Query heads (warps) one block serves at most; larger GQA groups split into head chunks.
  static constexpr int kMaxHeadsPerBlock = 16;
  static constexpr int kMaxThreads = 32 * kMaxHeadsPerBlock;
  static constexpr int kMaxRegisters = kPass1MaxRegisters;
  /// NHD stages: chunks per token row (packed) and no swizzle; the CUDA-core math reads consecutive
  /// chunks of one token, which is conflict-free as it is (TcPass1Policy pads and swizzles).
  static constexpr int kNhdRowChunks = kChunksPerToken;
  static constexpr bool kNhdSwizzle = false;
  /// Chunks of one operand's part of a stage (K first, then V).
  static constexpr int kOperandChunks = kTileChunks;
  /// Threads that issue the copies: the first four warps (a block has at least four). A fixed
  /// number makes each thread's chunk slots compile-time, so their geometry is computed once.
  static constexpr int kLoaderThreads = 128;
  static constexpr int kLoadsPerThread = (kTileChunks + kLoaderThreads - 1) / kLoaderThreads;  // per operand
  /// The math's exchange buffer between the stages and the segment table (none here).
  static constexpr int kExchangeBytes = 0;
  /// Static shared memory, one array (paged_decode.cuh, pass1_shared): the stages, the math's
  /// exchange buffer, the segment table (block ids per stage).
  static constexpr int kSmemBytes = kStages * kStageBytes + kExchangeBytes + kStages * kMaxSegments * 4;
  /// Alignment of the stage buffer: the math XORs compile-time terms (< 512 bytes) into addresses.
  static constexpr int kStageAlign = 1024;

  static_assert(D % kVec == 0 && D % kChunkElems == 0, "head size must be whole chunks per lane");
  static_assert(is_pow2(kLanes) && kLanes >= 8 && kLanes <= 32, "rows are 8..32 lanes of one warp");
  static_assert(kRowTokens >= kChunkElems, "a vLLM V chunk (CE tokens) lies within one row's tokens");
  static_assert(kRowTokens <= kLanes, "the reduce-scatter leaves one token per lane");
  static_assert(is_pow2(kTileTokens) && kTileTokens >= 4 && kTileTokens <= 32, "tile of 4..32 tokens");
  static_assert((kTileChunks % 8) == 0, "swizzles permute within 128-byte lines");
  static_assert((kTileChunks * 16) % 512 == 0, "K and V parts of a stage start 512-byte aligned");
  static_assert(kVGroups == 1 || kVGroups == 2 || kVGroups == 4, "vLLM V swizzle table");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory must fit without the opt-in attribute");
};

/// The tile geometry of an fp8 cache (one-byte elements; kFp8E4M3 / kFp8E5M2): the tensor-core
/// math reads it at every GQA group (pass1_uses_tensor_cores), so only what TileLoader, the stage
/// layouts and TcPass1Policy need is here. A chunk is 16 codes (the vLLM layout's x = 16). Tiles hold
/// 16 tokens (one vLLM V chunk is 16 consecutive tokens of one d, so a tile is whole such chunks),
/// 32 at D = 64 (a 4 KB stage, as the 16-bit D 80-128 stages): the same q and accumulator registers
/// per lane as the 16-bit tensor-core tiles at D <= 128.
template <int D>
struct Pass1Policy<1, D> {
  static constexpr int kChunkElems = 16;
  static constexpr int kChunksPerToken = D / kChunkElems;
  static constexpr int kTileTokens = D <= 64 ? 32 : 16;
  static constexpr int kRowTokens = kTileTokens;  // no CUDA-core rows; the report's per-row hint
  static constexpr int kStages = 4;
  static constexpr int kTileChunks = kTileTokens * kChunksPerToken;
  static constexpr int kStageBytes = 2 * kTileChunks * 16;
  static constexpr int kVGroups = kTileTokens / kChunkElems;
  static constexpr int kMaxSegments = cmax(1, kTileTokens / 8);
  static constexpr int kNhdRowChunks = kChunksPerToken;
  static constexpr bool kNhdSwizzle = false;
  static constexpr int kOperandChunks = kTileChunks;
  static constexpr int kLoaderThreads = 128;
  static constexpr int kLoadsPerThread = (kTileChunks + kLoaderThreads - 1) / kLoaderThreads;
  static constexpr int kExchangeBytes = 0;
  static constexpr int kSmemBytes = kStages * kStageBytes + kStages * kMaxSegments * 4;
  static constexpr int kStageAlign = 1024;
  static constexpr int kMaxRegisters = kPass1MaxRegisters;
  static_assert(D % kChunkElems == 0, "head size must be whole 16-code chunks");
  static_assert(kVGroups == 1 || kVGroups == 2, "vLLM V swizzle table");
};

/// How the tensor-core math feeds the softmax weights P (fp32) to the p.v mma, whose A operand is
/// fp16 / bf16. The named policy of issue 23; docs/design.md ("Numerical contract") has the bound of
/// each and the static report (bench/results/static/after-precision.md) the cost.
enum class TcPvWeights {
  /// P = hi + lo, both in the model dtype (hi = rn(p), lo = rn(p - hi)), two mma per k-step:
  /// each weight is kept to 2^-16 (bf16) / 2^-22 (fp16) of itself. The default.
  kHiLo,
  /// P rounded to the model dtype, one mma per k-step: 2^-9 (bf16) / 2^-12 (fp16) of each weight,
  /// as FlashAttention-style kernels do. Not instantiated; build with
  /// -DDECODEGRAPH_TC_PV_WEIGHTS_ROUNDED to measure it (kernel report) against kHiLo.
  kRounded,
};
#if defined(DECODEGRAPH_TC_PV_WEIGHTS_ROUNDED)
inline constexpr TcPvWeights kTcPvWeights = TcPvWeights::kRounded;
#else
inline constexpr TcPvWeights kTcPvWeights = TcPvWeights::kHiLo;
#endif

/// Pass-1 policy of the tensor-core math (TensorCoreMath in kernels/tensor_core_math.cuh; fp16 and
/// bf16 only). Tiles, stages, pipeline and loader are Pass1Policy's; what differs:
///  - four warps per block whatever the group: the block's query heads (<= 16) are the 16 rows of
///    one mma M dimension, and the warps split the tile's work (below);
///  - NHD stage rows are padded to a multiple of 8 chunks and swizzled by the token, c ^ (t & 7):
///    ldmatrix reads one chunk of 8 consecutive tokens, which unswizzled rows D * 2 bytes apart would
///    put in one bank group (8-way conflict at D = 64, 128, 256). vLLM layouts are Pass1Policy's
///    (both already conflict-free for these reads: tests/kernels/test_smem_layout.cpp);
///  - shared buffers for the warps' exchanges: the partial q.k tiles (one m16n8 accumulator, 16
///    bytes a lane), the weights as p.v A fragments (hi and lo) and the rows' rescale factors.
/// Work split per tile (NN = tile tokens / 8 token n-tiles; q.k has D/16 k-steps, p.v D/8 d-tiles):
/// warp w computes the partial q.k of token n-tile w % NN over k-steps [(w / NN) * KSW, + KSW); the
/// softmax of rows [4w, 4w + 4) (all the tile's tokens, kPairsPerLane token pairs a lane); and p.v
/// for d-tiles [w * NTW, + NTW). So a lane keeps KSW x 4 registers of q and NTW x 4 of the output
/// (at most 16 and 32 at D = 256) instead of D / 4 and D / 2 for one warp doing it all, and no
/// softmax runs twice.
/// fp8 caches (kElemBytes 1) run this math with fp16 mma operands: every code converts to fp16
/// exactly after ldmatrix (cvt.rn.f16x2.e4m3x2 / .e5m2x2, two codes per instruction), q is fp16 (or
/// bf16 converted to fp16 exactly, docs/kernels.md), and the weights are fp16 hi + lo. An ldmatrix
/// row of 16 codes gives a lane 4 consecutive codes, so the fp8 fragments permute the k index inside
/// each k16 step (the same permutation on both operands, so the sums are unchanged):
///   K (q.k, k = d): one matrix per k-step (16 d of 8 tokens); lane (g, t) holds d 4t .. 4t + 3,
///     i.e. B registers k 2t, 2t + 1 <- d 4t, 4t + 1 and k 2t + 8, 2t + 9 <- d 4t + 2, 4t + 3; q's
///     A fragments are loaded with the same columns.
///   vLLM V (p.v, k = token): one matrix per (p.v step, d-tile) (8 d-rows of 16 tokens), the same
///     permutation on the tokens; the weights' A fragments follow it (tc_weight_k).
///   NHD V: ldmatrix.trans of 8 tokens x 16 d gives a lane 2 tokens x 2 d; one PRMT splits them
///     into the B halves of two d-tiles, the even and the odd d of the 16 (so a warp owns d-tiles
///     in pairs, kDTilesPerWarp even); tokens keep their k order.
template <int kElemBytes, int D>
struct TcPass1Policy : Pass1Policy<kElemBytes, D> {
  using Base = Pass1Policy<kElemBytes, D>;
  static constexpr bool kFp8 = kElemBytes == 1;
  static constexpr int kNhdRowChunks = 8 * ((Base::kChunksPerToken + 7) / 8);
  static constexpr bool kNhdSwizzle = true;
  static constexpr int kOperandChunks = Base::kTileTokens * kNhdRowChunks;
  static constexpr int kStageBytes = 2 * kOperandChunks * 16;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPvSteps = (Base::kTileTokens + 15) / 16;                    // p.v k-steps
  /// Softmax split: warp w owns rows [4w, 4w + 4); a lane owns kPairsPerLane consecutive token
  /// pairs of one row, kLanesPerRow lanes per row. 8-token tiles have 16 pairs for 32 lanes: lanes
  /// 16-31 repeat lanes 0-15 (kSoftmaxLanes = 16) and store nothing.
  static constexpr int kPairsPerRow = Base::kTileTokens / 2;
  static constexpr int kPairsPerLane = cmax(1, 4 * kPairsPerRow / 32);
  static constexpr int kLanesPerRow = kPairsPerRow / kPairsPerLane;
  static constexpr int kSoftmaxLanes = 4 * kLanesPerRow;
  static constexpr TcPvWeights kPvWeights = kTcPvWeights;
  static constexpr int kWeightParts = kPvWeights == TcPvWeights::kHiLo ? 2 : 1;  // hi (, lo)
  /// Exchange buffers: partial q.k tiles [warp][lane] (16 bytes each); the weights as A fragments
  /// [part][p.v step][lane] (16 bytes); rescale factors of rows g and g + 8 [g] (8 bytes).
  static constexpr int kScoreBytes = kWarps * 32 * 16;
  static constexpr int kWeightBytes = kWeightParts * kPvSteps * 32 * 16;
  static constexpr int kFactorBytes = 8 * 8;
  static constexpr int kExchangeBytes = kScoreBytes + kWeightBytes + kFactorBytes;
  static constexpr int kSmemBytes =
      Base::kStages * kStageBytes + kExchangeBytes + Base::kStages * Base::kMaxSegments * 4;

  static constexpr int kTokenTiles = Base::kTileTokens / 8;                        // NN
  static constexpr int kKSplit = kWarps / kTokenTiles;                              // warps per n-tile
  static constexpr int kKSteps = D / 16;                                            // q.k k-steps
  static constexpr int kKStepsPerWarp = (kKSteps + kKSplit - 1) / kKSplit;          // KSW
  static constexpr int kDTiles = D / 8;                                             // p.v n-tiles
  /// fp8: in pairs of one 16-d chunk (NHD's even and odd d; vLLM follows, so a warp's matrices
  /// come in pairs for ldmatrix .x2 / .x4).
  static constexpr int kDTilesPerWarp = kFp8 ? 2 * ((Base::kChunksPerToken + kWarps - 1) / kWarps)
                                             : (kDTiles + kWarps - 1) / kWarps;     // NTW
  /// B registers of a p.v step that hold tokens: 1 when the tile has 8 tokens (the upper 8 of the
  /// k16 step are zero in both operands).
  static constexpr int kPvHalves = Base::kTileTokens >= 16 ? 2 : 1;
  /// 8x8 matrices (of 16-bit elements; 16 codes a row for fp8) one warp loads with ldmatrix per
  /// tile: K (two per k-step; fp8 one, rounded up to a pair) and V (fp8: one per step and d-tile).
  static constexpr int kKChunksPerStep = kFp8 ? 1 : 2;
  static constexpr int kKMatrices = kFp8 ? 2 * ((kKStepsPerWarp + 1) / 2) : 2 * kKStepsPerWarp;
  static constexpr int kVMatrices = kPvSteps * kDTilesPerWarp * (kFp8 ? 1 : kPvHalves);

  static_assert(kElemBytes == 2 || kElemBytes == 1, "mma.m16n8k16 takes fp16 / bf16 (fp8 converts to fp16)");
  static_assert(!kFp8 || Base::kTileTokens >= 16, "fp8: whole 16-token p.v steps");
  static_assert(Base::kTileTokens == 8 || Base::kTileTokens == 16 || Base::kTileTokens == 32, "n8 token tiles");
  static_assert(kWarps % kTokenTiles == 0, "every token n-tile gets the same number of warps");
  static_assert(D % 16 == 0, "k16 steps over the head dimension");
  static_assert(kKMatrices % 2 == 0 && kVMatrices % 2 == 0, "ldmatrix .x4 / .x2 groups");
  static_assert((kOperandChunks * 16) % 512 == 0, "K and V parts of a stage start 512-byte aligned");
  static_assert(kLanesPerRow == 4 || kLanesPerRow == 8, "row max over 4 or 8 lanes");
  static_assert(kSoftmaxLanes == 16 || kSoftmaxLanes == 32, "softmax lanes");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory must fit without the opt-in attribute");
};

/// Query heads one block serves for a GQA group: ceil(group / head_chunks) with head_chunks =
/// ceil(group / 16), so chunks are balanced (24 -> 2 x 12). Both maths use it (the tensor-core
/// math's M dimension is 16 rows).
constexpr int pass1_head_chunks_for(int group) { return (group + 15) / 16; }
constexpr int pass1_heads_per_block_for(int group) {
  const int chunks = pass1_head_chunks_for(group);
  return (group + chunks - 1) / chunks;
}
/// The one selection rule (launch_paged_decode, the occupancy model and the tests read it): the
/// tensor-core math for fp16 / bf16 with GQA groups of 4 or more, the CUDA-core math otherwise
/// (fp32; groups of 1-3, where 12-15 of the 16 mma rows would be padding).
/// elem_bytes is the KV cache's element size (AttentionSpec::kv_elem_size()): fp8 caches (1) run on
/// the tensor-core math at every group. Its cost per tile does not depend on the group, while the
/// CUDA-core math's per KV byte doubles with two values a byte (about 0.5 warp-instructions per
/// byte at GQA 1 against the tensor cores' ~0.2; docs/kernels.md, "fp8 KV caches").
constexpr bool pass1_uses_tensor_cores(int elem_bytes, int group) {
  return elem_bytes == 1 || (elem_bytes == 2 && group >= 4);
}
/// Query rows a pass-1 block's KV head serves for `group` heads and q_len tokens (DecodeParams::
/// group_size): the group itself for one token; for more, q_len slots of next_pow2(group) rows
/// (row v: token v >> log2, head v & (slots - 1); rows whose head is past the group are padding),
/// so that a row's token and head are a shift and a mask. The math follows this count.
constexpr int pass1_rows(int group, int q_len) { return q_len <= 1 ? group : next_pow2(group) * q_len; }

/// The one run-time to compile-time switch over head sizes of the host-side policy queries:
/// f(std::integral_constant<int, D>{}) for a supported head size d, `otherwise` for any other.
template <class F, class R>
constexpr R with_head_size(int d, F f, R otherwise) {
  switch (d) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 112: return f(std::integral_constant<int, 112>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 192: return f(std::integral_constant<int, 192>{});
    case 256: return f(std::integral_constant<int, 256>{});
  }
  return otherwise;
}
/// Tokens per pass-1 tile (Pass1Policy::kTileTokens; TcPass1Policy has the same tiles) for a
/// supported head size, at run time (0 otherwise): the host implementation tiles the softmax as the
/// kernel does.
constexpr int pass1_tile_tokens(int elem_bytes, int d) {
  return with_head_size(d, [&](auto D) {
    return elem_bytes == 1   ? Pass1Policy<1, decltype(D)::value>::kTileTokens
           : elem_bytes == 2 ? Pass1Policy<2, decltype(D)::value>::kTileTokens
                             : Pass1Policy<4, decltype(D)::value>::kTileTokens;
  }, 0);
}
/// Threads of a pass-1 block. CUDA-core math: one warp per head, at least four warps (the loader's
/// 128 threads; for groups below 4 the extra warps only copy). Tensor-core math: four warps.
constexpr int pass1_threads_for(int elem_bytes, int group) {
  return pass1_uses_tensor_cores(elem_bytes, group) ? 128 : 32 * cmax(4, pass1_heads_per_block_for(group));
}

// ---------------------------------------------------------------- shared-memory layouts
// Chunk positions inside one operand's tile (multiply by 16 for bytes). The loader copies 16-byte
// chunks verbatim (no transpose) and places them with these functions; the math reads with them.
// The swizzles XOR the chunk's position inside its 128-byte line with bits of the line index, so
// both the cp.async writes (consecutive global chunks) and the math's reads (the lanes of a row
// reading consecutive chunks of one token, or one d-row each) hit 8 distinct 16-byte bank groups.
// tests/kernels/test_smem_layout.cpp checks every (dtype, head size, block size, layout) for that.

/// NHD K and V: token-major, [token][chunk]. Pass1Policy: packed rows, unswizzled (reads and
/// writes both walk consecutive chunks). TcPass1Policy: rows of kNhdRowChunks (a multiple of 8) with
/// the chunk XORed by the token's low 3 bits, so 8 consecutive tokens' chunk c (one ldmatrix
/// matrix) hit 8 bank groups while a row's 8-chunk line is still written by 8 consecutive threads.
template <class P>
DG_HD constexpr int smem_pos_nhd(int token, int chunk) {
  return token * P::kNhdRowChunks + (P::kNhdSwizzle ? (chunk ^ (token & 7)) : chunk);
}

/// vLLM K ([.., head_size/x, block_size, x] in the cache): chunk-major [chunk][token], the page's own
/// order. Writes walk tokens of one chunk, reads walk chunks of one token: the line's chunk index
/// is XORed with the chunk number.
template <class P>
DG_HD constexpr int smem_pos_vllm_k(int token, int chunk) {
  constexpr int kShift = P::kTileTokens >= 8 ? ilog2(P::kTileTokens / 8) : 0;
  const int p = chunk * P::kTileTokens + token;
  return p ^ (((p >> 3) >> kShift) & 7);
}

/// vLLM V ([.., head_size, block_size] in the cache): d-major [d][token group], the page's own order
/// (a chunk is CE consecutive tokens of one d). Per (CE, groups per row) the XOR term spreads both
/// the reads (eight lanes, eight d-rows CE apart) and the writes (consecutive d-rows).
template <class P>
DG_HD constexpr int smem_pos_vllm_v(int d, int group) {
  constexpr int G = P::kVGroups;
  const int p = d * G + group;
  const int b = p >> 3;
  int f;
  if constexpr (G == 1) {
    f = b;
  } else if constexpr (G == 2) {
    f = P::kChunkElems == 8 ? ((b >> 1) ^ (b & 1)) : b;
  } else {
    f = P::kChunkElems == 8 ? ((b >> 2) ^ ((b & 1) << 1) ^ ((b >> 1) & 1)) : ((b >> 1) ^ ((b & 1) << 1));
  }
  return p ^ (f & 7);
}

// ---------------------------------------------------------------- the loader's chunks
// Chunk q (0 .. kTileChunks) of one operand of a tile, in the order the loader walks the cache
// pages (consecutive q = consecutive 16 bytes of global memory within a page row). seg_log2 =
// log2(min(block_size, kTileTokens)): the tile's tokens per cache block.

struct TileChunk {
  int token;  // first token (inside the tile) the chunk holds
  int index;  // NHD / vLLM K: the chunk of the token's row; vLLM V: the head-dimension element d
};
/// NHD K and V: [token][chunk] pages, q over the stage's rows (kNhdRowChunks chunks a token; with
/// TcPass1Policy's padded rows, index >= kChunksPerToken is padding the loader skips). Pass1Policy:
/// q is the shared-memory position itself.
template <class P>
DG_HD constexpr TileChunk loader_chunk_nhd(int q) {
  return TileChunk{q / P::kNhdRowChunks, q % P::kNhdRowChunks};
}
/// vLLM K: a segment is [chunk][token of the segment].
template <class P>
DG_HD constexpr TileChunk loader_chunk_vllm_k(int q, int seg_log2) {
  const int r = q >> seg_log2;
  return TileChunk{((r / P::kChunksPerToken) << seg_log2) | (q & ((1 << seg_log2) - 1)), r % P::kChunksPerToken};
}
/// vLLM V: a segment is [d][chunk of CE tokens].
template <class P, int D>
DG_HD constexpr TileChunk loader_chunk_vllm_v(int q, int seg_log2) {
  const int gps_log2 = seg_log2 - ilog2(P::kChunkElems);  // chunks per d-row per segment
  const int r = q >> gps_log2;
  return TileChunk{((r / D) << seg_log2) | ((q & ((1 << gps_log2) - 1)) * P::kChunkElems), r % D};
}

// ---------------------------------------------------------------- the math's read addresses
// The math reads K chunk j + k*L of token z*NR + i, and (vLLM V) d-row (j + k*L)*CE + e of token
// group z*NR/CE + g. Each read's byte address is a per-lane base (computed once, *_read_base) and a
// compile-time term: added for NHD (an immediate offset of the load), XORed into the low bits for
// the swizzled vLLM layouts (one LOP per load; the stage is kStageAlign-aligned, so the XOR stays
// inside it). The identities behind these are checked for every lane in test_smem_layout.cpp.

/// Byte offset, inside a stage's K part, of lane (z, j)'s first K read (token z*NR, chunk j).
template <class P, KVLayout kLayout>
DG_HD constexpr int k_read_base(int z, int j) {
  return 16 * (kLayout == KVLayout::kNHD ? smem_pos_nhd<P>(z * P::kRowTokens, j)
                                         : smem_pos_vllm_k<P>(z * P::kRowTokens, j));
}
/// Address of K chunk j + k*L of token z*NR + i, from base = stage K address + k_read_base.
/// (A: the address type, 32-bit shared addresses on the GPU, host addresses under the simulator.)
template <class P, KVLayout kLayout, class A>
DG_HD constexpr A k_read(A base, int i, int k) {
  if (kLayout == KVLayout::kNHD) return base + static_cast<A>(16 * (i * P::kChunksPerToken + k * P::kLanes));
  return (base ^ (static_cast<A>(i) << 4)) + static_cast<A>(16 * k * P::kLanes * P::kTileTokens);
}
/// Byte offset, inside a stage's V part, of lane (z, j)'s first V read.
template <class P, KVLayout kLayout>
DG_HD constexpr int v_read_base(int z, int j) {
  return 16 * (kLayout == KVLayout::kNHD ? smem_pos_nhd<P>(z * P::kRowTokens, j)
                                         : smem_pos_vllm_v<P>(j * P::kChunkElems, z * P::kRowTokens / P::kChunkElems));
}
/// NHD: address of V chunk j + k*L of token z*NR + i.
template <class P, class A>
DG_HD constexpr A v_read_nhd(A base, int i, int k) {
  return base + static_cast<A>(16 * (i * P::kChunksPerToken + k * P::kLanes));
}
/// vLLM: address of V d-row (j + k*L)*CE + e, token group z*NR/CE + g.
template <class P, class A>
DG_HD constexpr A v_read_vllm(A base, int g, int k, int e) {
  const int x = smem_pos_vllm_v<P>(e, g) ^ smem_pos_vllm_v<P>(0, 0);
  return (base ^ (static_cast<A>(x) << 4)) + static_cast<A>(16 * k * P::kLanes * P::kChunkElems * P::kVGroups);
}

// ---------------------------------------------------------------- the tensor-core math's ldmatrix rows
// TensorCoreMath loads its mma B fragments with ldmatrix: matrix mu of a warp's per-tile list is an
// 8x8 block of 16-bit elements whose 8 rows are 16-byte chunks of the stage. The list is loaded
// four matrices per ldmatrix.x4 (lane l gives the address of row l % 8 of matrix 4a + l / 8) and,
// when two are left, one .x2 (lanes 16-31 repeat lanes 0-15's addresses; the hardware ignores them).
//   K, matrix mu (non-transposed): rows = tokens 8 * (warp % NN) + r of chunk 2 * ks0 + mu (ks0 the
//   warp's first k-step); lane (g, t) receives K[token g][d 16 ks + 8 (mu & 1) + 2t, +1], i.e. the mma
//   B register mu & 1 of k-step mu / 2 (B[k = d][n = token], PTX ISA "mma.m16n8k16" fragments).
//   V, matrix mu = (kt * NTW + i) * H + h: d-tile dt = warp * NTW + i, tokens 16 kt + 8 h .. + 7.
//   vLLM V ([d][token group], d-major): rows = d 8 dt + r of token group 2 kt + h, non-transposed;
//   NHD V ([token][chunk]): rows = tokens 16 kt + 8 h + r of chunk dt, transposed. Either way lane
//   (g, t) receives V[tokens 16 kt + 8 h + 2t, +1][d 8 dt + g], the mma B register h of p.v step kt.
// Chunks and d-tiles past the head dimension (a warp's share rounded up) are clamped to the last
// real one: the math gives them zero q (k-steps) or never writes their output (d-tiles).

/// ldmatrix number `a` of a list of `n` matrices: the matrix whose row lane `lane` addresses.
DG_HD constexpr int tc_ldm_matrix(int a, int n, int lane) {
  const int width = cmin(4, n - 4 * a);  // 4 (.x4) or 2 (.x2)
  return 4 * a + (lane >> 3) % width;
}
/// Shared-memory chunk position (within the K part of a stage) of row `r` of K matrix `mu`.
template <class P, KVLayout kLayout>
DG_HD constexpr int tc_k_row_pos(int warp, int mu, int r) {
  const int token = 8 * (warp % P::kTokenTiles) + r;
  const int chunk = cmin(P::kKChunksPerStep * (warp / P::kTokenTiles) * P::kKStepsPerWarp + mu, P::kChunksPerToken - 1);
  return kLayout == KVLayout::kNHD ? smem_pos_nhd<P>(token, chunk) : smem_pos_vllm_k<P>(token, chunk);
}
/// Shared-memory chunk position (within the V part of a stage) of row `r` of V matrix `mu`.
/// fp8 (TcPass1Policy's comment): vLLM matrix mu = kt * NTW + i is d-tile warp * NTW + i (rows =
/// 8 d of token group kt, 16 tokens a row); NHD matrix mu = (kt * NTW / 2 + j) * 2 + h is chunk
/// warp * NTW / 2 + j (the d-tile pair 2j, 2j + 1) of tokens 16 kt + 8 h .. + 7, read transposed.
template <class P, KVLayout kLayout>
DG_HD constexpr int tc_v_row_pos(int warp, int mu, int r) {
  if constexpr (P::kFp8) {
    if (kLayout == KVLayout::kNHD) {
      constexpr int kPairs = P::kDTilesPerWarp / 2;
      const int h = mu % 2, pair = mu / 2;
      const int chunk = cmin(warp * kPairs + pair % kPairs, P::kChunksPerToken - 1);
      return smem_pos_nhd<P>(16 * (pair / kPairs) + 8 * h + r, chunk);
    }
    const int dt = cmin(warp * P::kDTilesPerWarp + mu % P::kDTilesPerWarp, P::kDTiles - 1);
    return smem_pos_vllm_v<P>(8 * dt + r, mu / P::kDTilesPerWarp);
  }
  const int h = mu % P::kPvHalves;
  const int pair = mu / P::kPvHalves;
  const int kt = pair / P::kDTilesPerWarp;
  const int dt = cmin(warp * P::kDTilesPerWarp + pair % P::kDTilesPerWarp, P::kDTiles - 1);
  return kLayout == KVLayout::kNHD ? smem_pos_nhd<P>(16 * kt + 8 * h + r, dt)
                                   : smem_pos_vllm_v<P>(8 * dt + r, 2 * kt + h);
}
/// Byte offsets, from the stage's K / V part, of the row lane `lane` of warp `warp` gives to the
/// a-th ldmatrix of the K / V list (per lane and stage-independent: computed once).
template <class P, KVLayout kLayout>
DG_HD constexpr int tc_k_ldm_offset(int warp, int lane, int a) {
  return 16 * tc_k_row_pos<P, kLayout>(warp, tc_ldm_matrix(a, P::kKMatrices, lane), lane & 7);
}
template <class P, KVLayout kLayout>
DG_HD constexpr int tc_v_ldm_offset(int warp, int lane, int a) {
  return 16 * tc_v_row_pos<P, kLayout>(warp, tc_ldm_matrix(a, P::kVMatrices, lane), lane & 7);
}

/// The k index (0..15) inside a p.v step of the step's token c (0..15): c itself, except for fp8
/// vLLM V, whose B fragments hold tokens 4t .. 4t + 3 in one lane (TcPass1Policy's comment):
/// k 2t + i <- token 4t + i and k 2t + 8 + i <- token 4t + 2 + i (i = 0, 1).
template <class P, KVLayout kLayout>
DG_HD constexpr int tc_weight_k(int c) {
  if (!(P::kFp8 && kLayout == KVLayout::kVLLM)) return c;
  return 2 * (c / 4) + (c % 2) + 8 * ((c / 2) % 2);
}

}  // namespace decodegraph::kernels
