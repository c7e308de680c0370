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
  static constexpr int kStageBytes = 2 * kTileChunks * 16;
  /// vLLM V tiles are d-major: kVGroups chunks (of CE consecutive tokens) per head-dimension row.
  static constexpr int kVGroups = kTileTokens / kChunkElems;
  /// Segments per tile at most (block_size >= 8).
  static constexpr int kMaxSegments = cmax(1, kTileTokens / 8);
  /// Query heads (warps) one block serves at most; larger GQA groups split into head chunks.
  static constexpr int kMaxHeadsPerBlock = 16;
  static constexpr int kMaxThreads = 32 * kMaxHeadsPerBlock;
  static constexpr int kMaxRegisters = kPass1MaxRegisters;
  /// Threads that issue the copies: the first four warps (a block has at least four). A fixed
  /// number makes each thread's chunk slots compile-time, so their geometry is computed once.
  static constexpr int kLoaderThreads = 128;
  static constexpr int kLoadsPerThread = (kTileChunks + kLoaderThreads - 1) / kLoaderThreads;  // per operand
  /// Static shared memory: the stages plus the segment table (block ids per stage).
  static constexpr int kSmemBytes = kStages * kStageBytes + kStages * kMaxSegments * 4;
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

/// Query heads one block serves for a GQA group: ceil(group / head_chunks) with head_chunks =
/// ceil(group / 16), so chunks are balanced (24 -> 2 x 12). One warp per head.
constexpr int pass1_head_chunks_for(int group) { return (group + 15) / 16; }
constexpr int pass1_heads_per_block_for(int group) {
  const int chunks = pass1_head_chunks_for(group);
  return (group + chunks - 1) / chunks;
}
/// Threads of a pass-1 block: one warp per head, at least four warps (the loader's 128 threads;
/// for groups below 4 the extra warps only copy).
constexpr int pass1_threads_for(int group) { return 32 * cmax(4, pass1_heads_per_block_for(group)); }

// ---------------------------------------------------------------- shared-memory layouts
// Chunk positions inside one operand's tile (multiply by 16 for bytes). The loader copies 16-byte
// chunks verbatim (no transpose) and places them with these functions; the math reads with them.
// The swizzles XOR the chunk's position inside its 128-byte line with bits of the line index, so
// both the cp.async writes (consecutive global chunks) and the math's reads (the lanes of a row
// reading consecutive chunks of one token, or one d-row each) hit 8 distinct 16-byte bank groups.
// tests/kernels/test_smem_layout.cpp checks every (dtype, head size, block size, layout) for that.

/// NHD K and V: token-major, [token][chunk], unswizzled: reads and writes are both consecutive.
template <class P>
DG_HD constexpr int smem_pos_nhd(int token, int chunk) {
  return token * P::kChunksPerToken + chunk;
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
/// NHD K and V: [token][chunk] pages; q is already the shared-memory position.
template <class P>
DG_HD constexpr TileChunk loader_chunk_nhd(int q) {
  return TileChunk{q / P::kChunksPerToken, q % P::kChunksPerToken};
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

}  // namespace decodegraph::kernels
