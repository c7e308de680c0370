// The tensor-core math of the pass-1 kernel (paged_decode.cuh), for fp16 / bf16 with GQA groups of
// 4 or more: q.k and p.v on mma.sync.m16n8k16 (fp32 accumulation), everything else as the
// CUDA-core math does it (exp2-domain online softmax in fp32, one fixed reduction order, V1 output
// or V2 partials in natural units, ALiBi, row strides, padded rows and partitions past the end).
//
// Mapping. The block's query heads (<= 16: the head chunk) are the 16 rows of M, padded with zero
// rows whose outputs are never written. Per tile of NTOK tokens (TcPass1Policy):
//   q.k  S[16 x NTOK] = Q K^T: N = tokens (NN = NTOK / 8 n-tiles), K = head dimension (D / 16
//        steps). Warp w computes the partial S of token n-tile w % NN over k-steps
//        [(w / NN) * KSW, + KSW): one m16n8 accumulator. B = K[token][d] comes straight from the
//        stage with ldmatrix (16-byte rows = 8 d of one token, in both layouts).
//   exchange  each lane stores its 4 partial values (16 bytes) into a 2 KB buffer, one barrier, and
//        every warp sums the partials of every n-tile in the same order: all four warps hold the
//        same S, bitwise.
//   softmax  logits in base 2, masked past the end, the row max over the 4 lanes of a quad, the
//        online update, p = 2^(s - m) in fp32; l is summed per lane and over the quad at the end.
//   p.v  O[16 x D] += P V: K = tokens (the S accumulators repacked to fp16 / bf16 are the A
//        fragments), N = d. Warp w owns d-tiles [w * NTW, + NTW); B = V[token][d] via ldmatrix:
//        non-transposed from the vLLM layout (d-major: a 16-byte row is 8 tokens of one d, which is
//        the B fragment's order), transposed from NHD.
// Why the split: one warp doing the whole tile would keep D / 2 accumulator and D / 4 q registers
// per lane (128 + 64 at D = 256); splitting d over the warps leaves NTW x 4 and KSW x 4 (<= 32 and
// 16), and the price is the 2 KB exchange and one barrier per tile. With tiles of 8 tokens
// (D >= 192) the p.v step's upper 8 tokens are zero in both operands.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template <typename T, int D, KVLayout kLayout>
struct TensorCoreMath {
  using Policy = TcPass1Policy<sizeof(T), D>;
  using P = Policy;
  static constexpr int kMaxRegisters = tc_pass1_max_registers(D, kLayout);
  static constexpr int NN = P::kTokenTiles;
  static constexpr int KSPLIT = P::kKSplit;
  static constexpr int KS = P::kKSteps;
  static constexpr int KSW = P::kKStepsPerWarp;
  static constexpr int NDT = P::kDTiles;
  static constexpr int NTW = P::kDTilesPerWarp;
  static constexpr int KT = P::kPvSteps;
  static constexpr int H = P::kPvHalves;
  static constexpr int MK = P::kKMatrices;
  static constexpr int MV = P::kVMatrices;
  static constexpr int LK = (MK + 3) / 4;  // ldmatrix per tile for K
  static constexpr int LV = (MV + 3) / 4;  // and for V

  uint32_t qa[KSW][4];  // A fragments of q for this warp's k-steps (zero past D and past the heads)
  float acc[NTW][4];    // C fragments of the output for this warp's d-tiles
  float m[2];           // running max (base 2) of rows g and g + 8
  float l[2];           // this lane's share of their exp sums until finish(); then the rows' totals
  float scale2;         // scale * log2(e)
  float slope2[2];      // ALiBi slope * log2(e) of rows g and g + 8
  int len;
  // Byte offsets, from a stage's K / V part, of this lane's ldmatrix row addresses (decode_policy.hpp).
  int k_off[LK];
  int v_off[LV];

  __device__ __forceinline__ static float4* exchange() {
    __shared__ __align__(16) float4 s_exchange[P::kWarps * 32];
    return s_exchange;
  }

  /// Rows (query heads) of this block and the first one's index.
  struct Rows {
    int count;
    int head0;
  };
  __device__ __forceinline__ static Rows rows(const DecodeParams& p) {
    const BlockHeads bh = block_heads(p);
    const int first = bh.chunk * p.heads_per_block;
    const int left = p.group_size - first;
    return Rows{p.heads_per_block < left ? p.heads_per_block : left, bh.kv_head * p.group_size + first};
  }

  /// Loads this warp's q fragments; every warp takes part.
  __device__ __forceinline__ bool init(const DecodeParams& p, int seq, int seq_len) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int g = lane >> 2;
    const int t = lane & 3;
    const Rows r = rows(p);
    len = seq_len;
    scale2 = p.scale * math::kLog2e;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = g + 8 * h;
      slope2[h] = p.alibi_slopes != nullptr && row < r.count ? p.alibi_slopes[r.head0 + row] * math::kLog2e : 0.0f;
      m[h] = math::neg_inf();
      l[h] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < NTW; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
    // a[reg]: row g + 8 (reg & 1), columns 16 ks + 8 (reg >> 1) + 2t, +1 (one 32-bit word).
    const T* q = static_cast<const T*>(p.q) + seq * p.q_stride + static_cast<int64_t>(r.head0) * D;
    const int ks0 = (warp / NN) * KSW;
#pragma unroll
    for (int i = 0; i < KSW; ++i)
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const int row = g + 8 * (reg & 1);
        const int col = 16 * (ks0 + i) + 8 * (reg >> 1) + 2 * t;
        qa[i][reg] = ks0 + i < KS && row < r.count
                         ? __ldg(reinterpret_cast<const uint32_t*>(q + static_cast<int64_t>(row) * D + col))
                         : 0u;
      }
#pragma unroll
    for (int a = 0; a < LK; ++a) k_off[a] = tc_k_ldm_offset<P, kLayout>(warp, lane, a);
#pragma unroll
    for (int a = 0; a < LV; ++a) v_off[a] = tc_v_ldm_offset<P, kLayout>(warp, lane, a);
    return true;
  }

  /// Loads the a-th group of a list of N matrices (ldmatrix .x4, or .x2 for the last two) into
  /// r[0..3] and calls use(mu, r[...]) for each matrix mu of the group: fragments are consumed as
  /// they arrive, so at most four B registers are live.
  template <int N, bool kTrans, class F>
  __device__ __forceinline__ static void for_matrices(dev::SmemAddr base, const int (&off)[(N + 3) / 4], F&& use) {
#pragma unroll
    for (int a = 0; a < (N + 3) / 4; ++a) {
      uint32_t r[4];
      constexpr int kLeft = N % 4;
      if (a < N / 4) {
        dev::ldmatrix<4, kTrans>(r, base + off[a]);
#pragma unroll
        for (int k = 0; k < 4; ++k) use(4 * a + k, r[k]);
      } else if constexpr (kLeft == 2) {
        dev::ldmatrix<2, kTrans>(r, base + off[a]);
        use(4 * a, r[0]);
        use(4 * a + 1, r[1]);
      }
    }
  }

  /// Folds tile tokens [tile_start, tile_start + NTOK) (those at or past `end` masked) into the
  /// state. sk / sv: shared addresses of the stage's K and V parts. Contains a block barrier: all
  /// warps call it for every tile.
  __device__ __forceinline__ void consume(dev::SmemAddr sk, dev::SmemAddr sv, int tile_start, int end) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int t = lane & 3;

    // Partial q.k of token n-tile warp % NN over this warp's k-steps (matrix 2i + b: B register b
    // of k-step i).
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t b0 = 0u;
    for_matrices<MK, false>(sk, k_off, [&](int mu, uint32_t b) {
      if (mu % 2 == 0) {
        b0 = b;
      } else {
        dev::mma_m16n8k16<T>(s, qa[mu / 2], b0, b);
      }
    });

    // Exchange: n-tile j's partials come from warps j, j + NN, ...; summed in that order by every
    // warp, so all warps hold the same S.
    float4* x = exchange();
    x[warp * 32 + lane] = float4{s[0], s[1], s[2], s[3]};
    __syncthreads();
    float S[NN][4];
#pragma unroll
    for (int j = 0; j < NN; ++j) {
      float4 v = x[j * 32 + lane];
#pragma unroll
      for (int kp = 1; kp < KSPLIT; ++kp) {
        const float4 o = x[(kp * NN + j) * 32 + lane];
        v.x += o.x;
        v.y += o.y;
        v.z += o.z;
        v.w += o.w;
      }
      S[j][0] = v.x;
      S[j][1] = v.y;
      S[j][2] = v.z;
      S[j][3] = v.w;
    }

    // Logits in base 2 (S[j][e]: row g + 8 (e >> 1), token 8j + 2t + (e & 1)), the rows' tile max
    // over the quad, the online-softmax update, the weights.
    float mx[2] = {math::neg_inf(), math::neg_inf()};
#pragma unroll
    for (int j = 0; j < NN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pos = tile_start + 8 * j + 2 * t + (e & 1);
        S[j][e] = pos < end ? math::logit(S[j][e], scale2, slope2[e >> 1], pos, len) : math::neg_inf();
        mx[e >> 1] = fmaxf(mx[e >> 1], S[j][e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 2));
      const float f = math::online_rescale2(m[h], l[h], mx[h]);
#pragma unroll
      for (int i = 0; i < NTW; ++i) {
        acc[i][2 * h] *= f;
        acc[i][2 * h + 1] *= f;
      }
    }
#pragma unroll
    for (int j = 0; j < NN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S[j][e] = math::exp2_shifted(S[j][e], m[e >> 1]);
        l[e >> 1] += S[j][e];
      }

    // p.v: the weights of tokens [16 kt, 16 kt + 16) as A fragments (n-tiles 2kt and 2kt + 1),
    // then matrix mu = (kt * NTW + i) * H + h is B register h of d-tile i's step kt.
    uint32_t pa[KT][4];
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      pa[kt][0] = pack_pair<T>(S[2 * kt][0], S[2 * kt][1]);
      pa[kt][1] = pack_pair<T>(S[2 * kt][2], S[2 * kt][3]);
      if constexpr (NN > 1) {
        pa[kt][2] = pack_pair<T>(S[2 * kt + 1][0], S[2 * kt + 1][1]);
        pa[kt][3] = pack_pair<T>(S[2 * kt + 1][2], S[2 * kt + 1][3]);
      } else {
        pa[kt][2] = 0u;  // tokens 8..15 of the step do not exist (8-token tiles)
        pa[kt][3] = 0u;
      }
    }
    uint32_t v0 = 0u;
    for_matrices<MV, kLayout == KVLayout::kNHD>(sv, v_off, [&](int mu, uint32_t b) {
      const int kt = mu / H / NTW;
      const int i = mu / H % NTW;
      if (H == 1) {
        dev::mma_m16n8k16<T>(acc[i], pa[kt], b, 0u);
      } else if (mu % 2 == 0) {
        v0 = b;
      } else {
        dev::mma_m16n8k16<T>(acc[i], pa[kt], v0, b);
      }
    });
  }

  /// Sums l over the quad (fixed order). m is the same in all lanes of a quad and in all warps.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(kFullMask, l[h], 1);
      l[h] += __shfl_xor_sync(kFullMask, l[h], 2);
    }
  }

  /// Each warp writes its d-tiles of the block's real rows: V1 the normalised output, V2 the
  /// partial (m in natural units and l from warp 0, acc / l).
  __device__ __forceinline__ void write(const DecodeParams& p, int seq, int part) const {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int g = lane >> 2;
    const int t = lane & 3;
    const Rows r = rows(p);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = g + 8 * h;
      if (row >= r.count) continue;
      const int q_head = r.head0 + row;
      if (p.write_partials) {
        const int64_t idx = math::partial_index(seq, q_head, part, p.num_q_heads, p.max_partitions);
        if (warp == 0 && t == 0) {
          p.max_logits[idx] = m[h] * math::kLn2;  // back to natural logits for the merge
          p.exp_sums[idx] = l[h];
        }
        float* dst = p.partial_out + idx * D;
#pragma unroll
        for (int i = 0; i < NTW; ++i) {
          const int dt = warp * NTW + i;
          if (NTW * P::kWarps == NDT || dt < NDT)
            *reinterpret_cast<float2*>(dst + 8 * dt + 2 * t) =
                float2{math::normalise(acc[i][2 * h], l[h]), math::normalise(acc[i][2 * h + 1], l[h])};
        }
      } else {
        T* dst = static_cast<T*>(p.out) + seq * p.out_stride + static_cast<int64_t>(q_head) * D;
#pragma unroll
        for (int i = 0; i < NTW; ++i) {
          const int dt = warp * NTW + i;
          if (NTW * P::kWarps == NDT || dt < NDT)
            *reinterpret_cast<uint32_t*>(dst + 8 * dt + 2 * t) =
                pack_pair<T>(math::normalise(acc[i][2 * h], l[h]), math::normalise(acc[i][2 * h + 1], l[h]));
        }
      }
    }
  }
};

// ---------------------------------------------------------------- launchers (inst/decode_tc_*.cu)

template <typename T, int D, KVLayout kLayout>
void enqueue_paged_decode_tc(const DecodeParams& p, cudaStream_t stream, const char* name) {
  enqueue_paged_decode<T, D, kLayout, TensorCoreMath>(p, TcPass1Policy<sizeof(T), D>::kThreads, stream, name);
}

template <typename T, int D, KVLayout kLayout>
int paged_decode_tc_blocks_per_sm() {
  return paged_decode_kernel_blocks_per_sm<T, D, kLayout, TensorCoreMath>(TcPass1Policy<sizeof(T), D>::kThreads);
}

}  // namespace decodegraph::kernels
