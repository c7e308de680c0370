// kernels/decode_policy.hpp: the pass-1 kernel's shared-memory layouts, for every (element size,
// head size, block size, layout):
//  - each layout places the tile's chunks one-to-one in the stage;
//  - the loader's chunk order covers the tile exactly once (no chunk left unwritten, which the
//    simulator would otherwise see as NaN only for the shapes it runs);
//  - the math's split of every read address into a per-lane base and a compile-time term equals
//    the layout function, in every stage of the ring;
//  - no bank conflicts: in every 8-thread phase of a 16-byte access (reads: the lanes of a warp as
//    the math maps them; writes: the loader's threads) the chunks hit 8 distinct 16-byte bank groups.
// The last check is what "breaking the swizzle" fails. Likewise for the tensor-core math's stages
// and ldmatrix rows (TcPass1Policy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/decode_policy.hpp"

namespace {

using decodegraph::KVLayout;
namespace k = decodegraph::kernels;

/// Worst bank-group multiplicity of one phase: accesses to the same chunk are one (broadcast).
int phase_conflict(const std::vector<long>& chunks) {
  std::map<long, std::set<long>> by_group;
  for (long c : chunks) by_group[((c % 8) + 8) % 8].insert(c);
  int worst = 0;
  for (const auto& [g, set] : by_group) worst = std::max(worst, static_cast<int>(set.size()));
  return worst;
}

/// Splits a warp's per-lane chunk positions (-1 = lane idle) into 8-lane phases.
int warp_conflict(const std::vector<long>& lane_chunk) {
  int worst = 0;
  for (int p0 = 0; p0 < 32; p0 += 8) {
    std::vector<long> phase;
    for (int l = p0; l < p0 + 8; ++l)
      if (lane_chunk[l] >= 0) phase.push_back(lane_chunk[l]);
    worst = std::max(worst, phase_conflict(phase));
  }
  return worst;
}

template <int E, int D>
void check_config() {
  using P = k::Pass1Policy<E, D>;
  constexpr int CE = P::kChunkElems, CPT = P::kChunksPerToken, L = P::kLanes, Z = P::kSlices;
  constexpr int NR = P::kRowTokens, NTOK = P::kTileTokens, KC = P::kChunksPerLane, G = P::kVGroups;
  const std::string what = "elem bytes " + std::to_string(E) + " D " + std::to_string(D);
  SCOPED_TRACE(what);

  // Bijections.
  std::set<int> nhd, vk, vv;
  for (int t = 0; t < NTOK; ++t)
    for (int c = 0; c < CPT; ++c) {
      nhd.insert(k::smem_pos_nhd<P>(t, c));
      vk.insert(k::smem_pos_vllm_k<P>(t, c));
    }
  for (int d = 0; d < D; ++d)
    for (int g = 0; g < G; ++g) vv.insert(k::smem_pos_vllm_v<P>(d, g));
  for (const auto* s : {&nhd, &vk, &vv}) {
    ASSERT_EQ(static_cast<int>(s->size()), P::kTileChunks);
    EXPECT_EQ(*s->begin(), 0);
    EXPECT_EQ(*s->rbegin(), P::kTileChunks - 1);
  }

  // Loader: covers every position once, conflict-free writes, for every block size.
  for (int bs : {8, 16, 32}) {
    SCOPED_TRACE("block_size " + std::to_string(bs));
    const int seg_log2 = std::min(k::ilog2(bs), k::ilog2(NTOK));
    for (int layout = 0; layout < 3; ++layout) {  // NHD (K and V), vLLM K, vLLM V
      std::vector<long> pos(P::kTileChunks);
      std::set<long> seen;
      for (int q = 0; q < P::kTileChunks; ++q) {
        if (layout == 0) {
          const k::TileChunk ch = k::loader_chunk_nhd<P>(q);
          pos[q] = k::smem_pos_nhd<P>(ch.token, ch.index);
          EXPECT_EQ(pos[q], q);
        } else if (layout == 1) {
          const k::TileChunk ch = k::loader_chunk_vllm_k<P>(q, seg_log2);
          ASSERT_LT(ch.token, NTOK);
          pos[q] = k::smem_pos_vllm_k<P>(ch.token, ch.index);
        } else {
          const k::TileChunk ch = k::loader_chunk_vllm_v<P, D>(q, seg_log2);
          ASSERT_EQ(ch.token % CE, 0);
          pos[q] = k::smem_pos_vllm_v<P>(ch.index, ch.token / CE);
        }
        seen.insert(pos[q]);
      }
      EXPECT_EQ(static_cast<int>(seen.size()), P::kTileChunks) << "loader layout " << layout;
      // Threads tid = 0..kLoaderThreads-1 issue slot u together: q = tid + u * kLoaderThreads.
      for (int u = 0; u < P::kLoadsPerThread; ++u)
        for (int w = 0; w < P::kLoaderThreads; w += 32) {
          std::vector<long> lanes(32, -1);
          for (int l = 0; l < 32; ++l) {
            const int q = w + l + u * P::kLoaderThreads;
            if (q < P::kTileChunks) lanes[l] = pos[q];
          }
          EXPECT_LE(warp_conflict(lanes), 1) << "loader layout " << layout << " slot " << u << " warp " << w / 32;
        }
    }
  }

  // Math reads: address split == layout function, and conflict-free, in every stage.
  const uint32_t kAligned = 7u * P::kStageAlign;  // any kStageAlign-aligned array address
  for (int stage = 0; stage < P::kStages; ++stage) {
    const uint32_t sk = kAligned + stage * P::kStageBytes;
    const uint32_t sv = sk + P::kTileChunks * 16;
    for (int layout = 0; layout < 2; ++layout) {
      const bool vllm = layout == 0;
      // K (and NHD V, the same reads).
      for (int i = 0; i < NR; ++i)
        for (int kc = 0; kc < KC; ++kc) {
          std::vector<long> lanes(32, -1);
          for (int lane = 0; lane < 32; ++lane) {
            const int z = lane / L, j = lane % L, c = j + kc * L;
            if (c >= CPT) continue;
            const uint32_t a = vllm ? k::k_read<P, KVLayout::kVLLM>(sk + k::k_read_base<P, KVLayout::kVLLM>(z, j), i, kc)
                                    : k::k_read<P, KVLayout::kNHD>(sk + k::k_read_base<P, KVLayout::kNHD>(z, j), i, kc);
            const int expect = vllm ? k::smem_pos_vllm_k<P>(z * NR + i, c) : k::smem_pos_nhd<P>(z * NR + i, c);
            ASSERT_EQ(a, sk + 16u * expect) << "K read lane " << lane << " i " << i << " k " << kc;
            if (!vllm) {
              ASSERT_EQ(k::v_read_nhd<P>(sv + k::v_read_base<P, KVLayout::kNHD>(z, j), i, kc), sv + 16u * expect);
            }
            lanes[lane] = static_cast<long>(a / 16);
          }
          EXPECT_LE(warp_conflict(lanes), 1) << (vllm ? "vLLM" : "NHD") << " K read i " << i << " k " << kc;
        }
    }
    // vLLM V reads: d-row (j + k*L)*CE + e of token group z*NR/CE + g.
    for (int g = 0; g < NR / CE; ++g)
      for (int kc = 0; kc < KC; ++kc)
        for (int e = 0; e < CE; ++e) {
          std::vector<long> lanes(32, -1);
          for (int lane = 0; lane < 32; ++lane) {
            const int z = lane / L, j = lane % L, c = j + kc * L;
            if (c >= CPT) continue;
            const uint32_t a = k::v_read_vllm<P>(sv + k::v_read_base<P, KVLayout::kVLLM>(z, j), g, kc, e);
            const int expect = k::smem_pos_vllm_v<P>(c * CE + e, z * NR / CE + g);
            ASSERT_EQ(a, sv + 16u * expect) << "V read lane " << lane << " g " << g << " k " << kc << " e " << e;
            lanes[lane] = static_cast<long>(a / 16);
          }
          EXPECT_LE(warp_conflict(lanes), 1) << "vLLM V read g " << g << " k " << kc << " e " << e;
        }
  }
  (void)Z;
}

template <int E, int... Ds>
void check_all() {
  (check_config<E, Ds>(), ...);
}

TEST(SmemLayout, BijectiveCoveredAndBankConflictFree) {
  check_all<2, 64, 80, 96, 112, 128, 192, 256>();
  check_all<4, 64, 80, 96, 112, 128, 192, 256>();
}

// The tensor-core math (TcPass1Policy): NHD rows padded to 8-chunk multiples and swizzled by the
// token; the loader writes each real chunk once, conflict-free, and never a padding chunk; every
// ldmatrix row a warp addresses holds the (token, chunk) or (d, token group) the mma fragment needs
// (decode_policy.hpp), lies in a written chunk, and each 8-row matrix hits 8 bank groups; the warps'
// K matrices together cover every (token, chunk) of the tile, their V matrices every d-tile.
template <int D>
void check_tc_config() {
  using P = k::TcPass1Policy<2, D>;
  constexpr int CPT = P::kChunksPerToken, NTOK = P::kTileTokens, NN = P::kTokenTiles, G = P::kVGroups;
  SCOPED_TRACE("tensor cores D " + std::to_string(D));
  // NHD: positions of real chunks, distinct, inside the operand's part.
  std::set<long> nhd;
  for (int t = 0; t < NTOK; ++t)
    for (int c = 0; c < CPT; ++c) {
      const int q = k::smem_pos_nhd<P>(t, c);
      ASSERT_LT(q, P::kOperandChunks);
      nhd.insert(q);
    }
  ASSERT_EQ(static_cast<int>(nhd.size()), NTOK * CPT);
  // NHD loader: slot q = tid + u * 128 over the padded rows, padding skipped.
  constexpr int kSlots = P::kOperandChunks, U = (kSlots + P::kLoaderThreads - 1) / P::kLoaderThreads;
  std::set<long> written;
  for (int u = 0; u < U; ++u)
    for (int w = 0; w < P::kLoaderThreads; w += 32) {
      std::vector<long> lanes(32, -1);
      for (int l = 0; l < 32; ++l) {
        const int q = w + l + u * P::kLoaderThreads;
        if (q >= kSlots) continue;
        const k::TileChunk ch = k::loader_chunk_nhd<P>(q);
        if (ch.index >= CPT) continue;
        lanes[l] = k::smem_pos_nhd<P>(ch.token, ch.index);
        EXPECT_TRUE(written.insert(lanes[l]).second) << "NHD chunk written twice";
      }
      EXPECT_LE(warp_conflict(lanes), 1) << "tc NHD loader slot " << u << " warp " << w / 32;
    }
  EXPECT_EQ(written, nhd);
  std::set<long> vk, vv;
  for (int t = 0; t < NTOK; ++t)
    for (int c = 0; c < CPT; ++c) vk.insert(k::smem_pos_vllm_k<P>(t, c));
  for (int d = 0; d < D; ++d)
    for (int g = 0; g < G; ++g) vv.insert(k::smem_pos_vllm_v<P>(d, g));

  for (int layout = 0; layout < 2; ++layout) {
    const bool vllm = layout == 0;
    std::set<std::pair<int, int>> k_cover, v_cover;  // (token tile, chunk), (token group, d-tile)
    for (int warp = 0; warp < P::kWarps; ++warp) {
      for (int a = 0; a < (P::kKMatrices + 3) / 4; ++a) {
        const int width = std::min(4, P::kKMatrices - 4 * a);
        std::vector<long> lanes(32, -1);
        for (int lane = 0; lane < 8 * width; ++lane) {
          const int off = vllm ? k::tc_k_ldm_offset<P, KVLayout::kVLLM>(warp, lane, a)
                               : k::tc_k_ldm_offset<P, KVLayout::kNHD>(warp, lane, a);
          ASSERT_EQ(off % 16, 0);
          const int mu = 4 * a + lane / 8, r = lane % 8;
          const int token = 8 * (warp % NN) + r;
          const int chunk = 2 * (warp / NN) * P::kKStepsPerWarp + mu;
          const int real = std::min(chunk, CPT - 1);
          ASSERT_EQ(off / 16, vllm ? k::smem_pos_vllm_k<P>(token, real) : k::smem_pos_nhd<P>(token, real))
              << "K warp " << warp << " lane " << lane << " ldmatrix " << a;
          if (chunk < CPT) k_cover.insert({warp % NN, chunk});
          lanes[lane] = off / 16;
        }
        EXPECT_LE(warp_conflict(lanes), 1) << (vllm ? "vLLM" : "NHD") << " K ldmatrix " << a << " warp " << warp;
      }
      for (int a = 0; a < (P::kVMatrices + 3) / 4; ++a) {
        const int width = std::min(4, P::kVMatrices - 4 * a);
        std::vector<long> lanes(32, -1);
        for (int lane = 0; lane < 8 * width; ++lane) {
          const int off = vllm ? k::tc_v_ldm_offset<P, KVLayout::kVLLM>(warp, lane, a)
                               : k::tc_v_ldm_offset<P, KVLayout::kNHD>(warp, lane, a);
          const int mu = 4 * a + lane / 8, r = lane % 8;
          const int h = mu % P::kPvHalves, pair = mu / P::kPvHalves;
          const int kt = pair / P::kDTilesPerWarp, dt = warp * P::kDTilesPerWarp + pair % P::kDTilesPerWarp;
          const int real = std::min(dt, P::kDTiles - 1);
          const int group = 2 * kt + h;  // 8-token group of the tile
          ASSERT_LT(group * 8, NTOK);
          const long expect = vllm ? k::smem_pos_vllm_v<P>(8 * real + r, group) : k::smem_pos_nhd<P>(8 * group + r, real);
          ASSERT_EQ(off / 16, expect) << "V warp " << warp << " lane " << lane << " ldmatrix " << a;
          EXPECT_TRUE(vllm ? vv.count(expect) : nhd.count(expect)) << "V row never written";
          if (dt < P::kDTiles) v_cover.insert({group, dt});
          lanes[lane] = off / 16;
        }
        EXPECT_LE(warp_conflict(lanes), 1) << (vllm ? "vLLM" : "NHD") << " V ldmatrix " << a << " warp " << warp;
      }
    }
    EXPECT_EQ(static_cast<int>(k_cover.size()), NN * CPT) << "K chunks no warp reads";
    EXPECT_EQ(static_cast<int>(v_cover.size()), NTOK / 8 * P::kDTiles) << "V d-tiles no warp reads";
  }
  (void)vk;
}

TEST(SmemLayout, TensorCoreStagesAndLdmatrixRows) {
  check_tc_config<64>();
  check_tc_config<80>();
  check_tc_config<96>();
  check_tc_config<112>();
  check_tc_config<128>();
  check_tc_config<192>();
  check_tc_config<256>();
}

// fp8 caches (TcPass1Policy<1, D>: 16-code chunks, 16- or 32-token tiles): the vLLM stages are
// bijective and the loader writes them conflict-free for every block size (block size 8: each
// stage chunk (d, token group) takes two 8-byte halves, one thread per chunk, consecutive threads
// consecutive d); the NHD loader as the 16-bit one; every ldmatrix row holds what the fp8
// fragments need (one K matrix per k-step, one V matrix per p.v step and d-tile for vLLM, per step,
// chunk and token half for NHD), conflict-free, and the warps together read every K chunk and V
// d-tile; tc_weight_k is the permutation the vLLM V fragments imply.
template <int D>
void check_fp8_config() {
  using P = k::TcPass1Policy<1, D>;
  constexpr int CPT = P::kChunksPerToken, NTOK = P::kTileTokens, NN = P::kTokenTiles, G = P::kVGroups;
  constexpr int NTW = P::kDTilesPerWarp;
  static_assert(P::kChunkElems == 16 && NTOK % 16 == 0 && NTW % 2 == 0);
  SCOPED_TRACE("fp8 D " + std::to_string(D));
  std::set<long> vk, vv, nhd;
  for (int t = 0; t < NTOK; ++t)
    for (int c = 0; c < CPT; ++c) {
      vk.insert(k::smem_pos_vllm_k<P>(t, c));
      nhd.insert(k::smem_pos_nhd<P>(t, c));
    }
  for (int d = 0; d < D; ++d)
    for (int g = 0; g < G; ++g) vv.insert(k::smem_pos_vllm_v<P>(d, g));
  ASSERT_EQ(static_cast<int>(vk.size()), P::kTileChunks);
  ASSERT_EQ(static_cast<int>(vv.size()), P::kTileChunks);
  ASSERT_EQ(static_cast<int>(nhd.size()), P::kTileChunks);
  ASSERT_LT(*vk.rbegin(), P::kOperandChunks);
  ASSERT_LT(*vv.rbegin(), P::kOperandChunks);
  {  // NHD loader over the padded rows
    constexpr int U = (P::kOperandChunks + P::kLoaderThreads - 1) / P::kLoaderThreads;
    std::set<long> written;
    for (int u = 0; u < U; ++u)
      for (int w = 0; w < P::kLoaderThreads; w += 32) {
        std::vector<long> lanes(32, -1);
        for (int l = 0; l < 32; ++l) {
          const int q = w + l + u * P::kLoaderThreads;
          if (q >= P::kOperandChunks) continue;
          const k::TileChunk ch = k::loader_chunk_nhd<P>(q);
          if (ch.index >= CPT) continue;
          lanes[l] = k::smem_pos_nhd<P>(ch.token, ch.index);
          EXPECT_TRUE(written.insert(lanes[l]).second) << "NHD chunk written twice";
        }
        EXPECT_LE(warp_conflict(lanes), 1) << "fp8 NHD loader slot " << u << " warp " << w / 32;
      }
    EXPECT_EQ(written, nhd);
  }
  for (int bs : {8, 16, 32}) {
    SCOPED_TRACE("block_size " + std::to_string(bs));
    const int seg_log2 = std::min(k::ilog2(bs), k::ilog2(NTOK));
    for (int layout = 0; layout < 2; ++layout) {  // vLLM K, vLLM V
      std::vector<long> pos(P::kTileChunks);
      std::set<long> seen;
      for (int q = 0; q < P::kTileChunks; ++q) {
        if (layout == 0) {
          const k::TileChunk ch = k::loader_chunk_vllm_k<P>(q, seg_log2);
          pos[q] = k::smem_pos_vllm_k<P>(ch.token, ch.index);
        } else if (bs < P::kChunkElems) {  // the half-row loader (paged_decode.cuh)
          pos[q] = k::smem_pos_vllm_v<P>(q % D, q / D);
        } else {
          const k::TileChunk ch = k::loader_chunk_vllm_v<P, D>(q, seg_log2);
          ASSERT_EQ(ch.token % 16, 0);
          pos[q] = k::smem_pos_vllm_v<P>(ch.index, ch.token / 16);
        }
        seen.insert(pos[q]);
      }
      EXPECT_EQ(seen, layout == 0 ? vk : vv) << "loader layout " << layout;
      for (int u = 0; u < P::kLoadsPerThread; ++u)
        for (int w = 0; w < P::kLoaderThreads; w += 32) {
          std::vector<long> lanes(32, -1);
          for (int l = 0; l < 32; ++l) {
            const int q = w + l + u * P::kLoaderThreads;
            if (q < P::kTileChunks) lanes[l] = pos[q];
          }
          EXPECT_LE(warp_conflict(lanes), 1) << "fp8 loader layout " << layout << " slot " << u;
        }
    }
  }
  for (int layout = 0; layout < 2; ++layout) {
    const bool vllm = layout == 0;
    std::set<std::pair<int, int>> k_cover, v_cover;
    for (int warp = 0; warp < P::kWarps; ++warp) {
      const int ks0 = (warp / NN) * P::kKStepsPerWarp;
      for (int a = 0; a < (P::kKMatrices + 3) / 4; ++a) {
        const int width = std::min(4, P::kKMatrices - 4 * a);
        std::vector<long> lanes(32, -1);
        for (int lane = 0; lane < 8 * width; ++lane) {
          const int off = vllm ? k::tc_k_ldm_offset<P, KVLayout::kVLLM>(warp, lane, a)
                               : k::tc_k_ldm_offset<P, KVLayout::kNHD>(warp, lane, a);
          const int mu = 4 * a + lane / 8, r = lane % 8;
          const int token = 8 * (warp % NN) + r, chunk = ks0 + mu, real = std::min(chunk, CPT - 1);
          ASSERT_EQ(off / 16, vllm ? k::smem_pos_vllm_k<P>(token, real) : k::smem_pos_nhd<P>(token, real))
              << "K warp " << warp << " lane " << lane << " ldmatrix " << a;
          if (mu < P::kKStepsPerWarp && chunk < CPT) k_cover.insert({warp % NN, chunk});
          lanes[lane] = off / 16;
        }
        EXPECT_LE(warp_conflict(lanes), 1) << (vllm ? "vLLM" : "NHD") << " fp8 K ldmatrix " << a << " warp " << warp;
      }
      for (int a = 0; a < (P::kVMatrices + 3) / 4; ++a) {
        const int width = std::min(4, P::kVMatrices - 4 * a);
        std::vector<long> lanes(32, -1);
        for (int lane = 0; lane < 8 * width; ++lane) {
          const int off = vllm ? k::tc_v_ldm_offset<P, KVLayout::kVLLM>(warp, lane, a)
                               : k::tc_v_ldm_offset<P, KVLayout::kNHD>(warp, lane, a);
          const int mu = 4 * a + lane / 8, r = lane % 8;
          long expect;
          if (vllm) {
            const int kt = mu / NTW, dt = warp * NTW + mu % NTW, real = std::min(dt, P::kDTiles - 1);
            expect = k::smem_pos_vllm_v<P>(8 * real + r, kt);
            if (dt < P::kDTiles) v_cover.insert({kt, dt});
            EXPECT_TRUE(vv.count(expect)) << "V row never written";
          } else {
            const int h = mu % 2, pair = mu / 2, kt = pair / (NTW / 2);
            const int chunk = warp * (NTW / 2) + pair % (NTW / 2), real = std::min(chunk, CPT - 1);
            expect = k::smem_pos_nhd<P>(16 * kt + 8 * h + r, real);
            if (chunk < CPT) v_cover.insert({2 * kt + h, chunk});
            EXPECT_TRUE(nhd.count(expect)) << "V row never written";
          }
          ASSERT_EQ(off / 16, expect) << "V warp " << warp << " lane " << lane << " ldmatrix " << a;
          lanes[lane] = off / 16;
        }
        EXPECT_LE(warp_conflict(lanes), 1) << (vllm ? "vLLM" : "NHD") << " fp8 V ldmatrix " << a << " warp " << warp;
      }
    }
    EXPECT_EQ(static_cast<int>(k_cover.size()), NN * CPT) << "K chunks no warp reads";
    EXPECT_EQ(static_cast<int>(v_cover.size()), vllm ? NTOK / 16 * P::kDTiles : NTOK / 8 * CPT)
        << "V no warp reads";
  }
  // The vLLM V fragments: lane t holds tokens 4t .. 4t + 3 of a 16-token group, as k 2t, 2t + 1,
  // 2t + 8, 2t + 9; NHD keeps the order.
  std::set<int> ks;
  for (int c = 0; c < 16; ++c) {
    const int kk = k::tc_weight_k<P, KVLayout::kVLLM>(c);
    ks.insert(kk);
    EXPECT_EQ(kk, 2 * (c / 4) + (c % 2) + 8 * ((c % 4) / 2)) << c;
    EXPECT_EQ((k::tc_weight_k<P, KVLayout::kNHD>(c)), c);
  }
  EXPECT_EQ(static_cast<int>(ks.size()), 16);
}

TEST(SmemLayout, Fp8StagesAndLdmatrixRows) {
  check_fp8_config<64>();
  check_fp8_config<80>();
  check_fp8_config<96>();
  check_fp8_config<112>();
  check_fp8_config<128>();
  check_fp8_config<192>();
  check_fp8_config<256>();
}

TEST(SmemLayout, ConflictCounterSeesConflicts) {
  // The check above must be able to fail: eight lanes reading chunks 128 bytes apart conflict
  // 8-way, and a broadcast (all lanes on one chunk) does not conflict.
  std::vector<long> strided(32), same(32, 5);
  for (int l = 0; l < 32; ++l) strided[l] = 8L * l;
  EXPECT_EQ(warp_conflict(strided), 8);
  EXPECT_EQ(warp_conflict(same), 1);
}

}  // namespace
