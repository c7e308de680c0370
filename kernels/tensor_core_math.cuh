// The tensor-core math of the pass-1 kernel (paged_decode.cuh), for fp16 / bf16 with GQA groups of
// 4 or more: q.k and p.v on mma.sync.m16n8k16 (fp32 accumulation), the softmax in fp32 (exp2
// domain, online, one fixed reduction order), V1 output or V2 partials in natural units, ALiBi, row
// strides, padded rows and partitions past the end, like the CUDA-core math.
//
// Mapping. The block's query heads (<= 16: the head chunk) are the 16 rows of M, padded with zero
// rows whose outputs are never written. Per tile of NTOK tokens (TcPass1Policy):
//   q.k  S[16 x NTOK] = Q K^T: N = tokens (NN = NTOK / 8 n-tiles), K = head dimension (D / 16
//        steps). Warp w computes the partial S of token n-tile w % NN over k-steps
//        [(w / NN) * KSW, + KSW): one m16n8 accumulator. B = K[token][d] comes straight from the
//        stage with ldmatrix (16-byte rows = 8 d of one token, in both layouts). k-steps past D
//        (D = 80, 112) are skipped, so a +-inf in the clamped K chunk they would read cannot
//        multiply q = 0 into NaN.
//   scores  each lane stores its 4 partial values (16 bytes) into a 2 KB buffer, one barrier.
//   softmax  warp w owns rows [4w, 4w + 4): a lane sums the partials of its kPairsPerLane token
//        pairs of one row (fixed order), forms the logits in base 2 (masked past the end in the
//        partition's last tile only), takes the row max over its kLanesPerRow lanes, the online
//        step (one -inf guard per row), the weights p = ex2.approx(s - sub) in fp32, and stores
//        them as p.v A fragments: hi = rn(p), lo = rn(p - hi) in the model dtype (TcPvWeights), and
//        the row's rescale factor. The pipeline's barrier (paged_decode_body) publishes them.
//   p.v  O[16 x D] = O * f + (hi + lo) V: K = tokens, N = d, two mma per k-step (hi, then lo).
//        Warp w owns d-tiles [w * NTW, + NTW); B = V[token][d] via ldmatrix: non-transposed from
//        the vLLM layout (d-major: a 16-byte row is 8 tokens of one d, the B fragment's order),
//        transposed from NHD. One more pair of mma with B = ones sums the weights exactly as the
//        products used them: that sum, l, normalises the output, so its weights sum to 1.
// Why the split: one warp doing the whole tile would keep D / 2 accumulator and D / 4 q registers
// per lane (128 + 64 at D = 256); splitting d over the warps leaves NTW x 4 and KSW x 4 (<= 32 and
// 16); splitting the softmax over the warps runs it once, not four times, for the price of a 1-2 KB
// exchange inside the pipeline's barrier. With tiles of 8 tokens (D >= 192) the p.v step's upper 8
// tokens are zero in both operands.
// Numerics (docs/design.md, "Numerical contract"): each weight keeps 2^-16 (bf16) / 2^-22 (fp16)
// of itself; fp16 weights are scaled by 2^15 (math::kTcWeightShiftFp16) so that the lo parts stay
// normal numbers. host_attention.cpp models this math per path.
// fp8 caches (KV = __nv_fp8_e4m3 / __nv_fp8_e5m2, inst/decode_fp8*.cu): the same math on fp16
// operands at every GQA group. The codes convert to fp16 exactly after ldmatrix, two per cvt
// (dev::fp8x4_to_half2x2), with the k index permuted inside each k16 step as TcPass1Policy's
// comment says; q is fp16, or bf16 scaled per row by a power of two 2^s that brings its largest
// magnitude to [2^14, 2^15) and converted to fp16 (exact for every element above 2^-38 of the row's
// largest); k_scale and 2^-s fold into the logit's scale, v_scale into the output (V1) or the
// partial output (V2): K and V themselves are never multiplied.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/paged_decode.cuh"

namespace decodegraph::kernels {

template <typename T, typename KV, int D, KVLayout kLayout>
struct TensorCoreMath {
  /// fp8 caches: T is the mma's fp16; q and out are fp16 or bf16 by p.io_bf16.
  static constexpr bool kFp8 = sizeof(KV) == 1;
  static_assert(kFp8 ? std::is_same_v<T, __half> : std::is_same_v<T, KV>, "fp8 caches compute in fp16");
  using Policy = TcPass1Policy<sizeof(KV), D>;
  using P = Policy;
  static constexpr int kMaxRegisters = tc_pass1_max_registers(D, kLayout, kFp8);
  /// The driver runs consume, then its barrier, then accumulate (paged_decode_body).
  static constexpr bool kSplitTile = true;
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
  static constexpr int PPL = P::kPairsPerLane;
  static constexpr int LPR = P::kLanesPerRow;
  static constexpr int WP = P::kWeightParts;  // 2: hi and lo; 1: rounded weights
  static constexpr bool kFp16 = std::is_same_v<T, __half>;
  static constexpr float kShift = kFp16 ? static_cast<float>(math::kTcWeightShiftFp16) : 0.0f;
  static constexpr uint32_t kOnes = kFp16 ? 0x3c003c00u : 0x3f803f80u;  // (1, 1) in T
  /// k-steps past D exist when the warps' shares do not divide D / 16 (D = 80, 112).
  static constexpr bool kPaddedKSteps = KSW * KSPLIT != KS;
  /// Words between the weights of a lane's consecutive token pairs (tc_weight_k's permutation).
  static constexpr int kPairWords = kFp8 && kLayout == KVLayout::kVLLM ? 2 : 4;

  uint32_t qa[KSW][4];  // A fragments of q for this warp's k-steps (zero past D and past the heads)
  float acc[NTW][4];    // C fragments of the output for this warp's d-tiles
  float lsum[2];        // sum of the weights (the products' own: weights x ones) of rows g, g + 8
  float m;              // running max (base 2) of the softmax row this lane owns
  float scale2;         // fp8: scale * log2(e) * k_scale * 2^-s of the owned row (else p.scale2)
  float vscale;         // fp8: v_scale of the block's KV head (1 otherwise)
  float oscale[2];      // V1 rows g, g + 8: the sink's rescale of the output (1 unless it raises the max)
  float slope2;         // ALiBi slope * log2(e) of the owned row (0 for padded rows)
  int pos_off;          // the owned pairs' first token in the tile, minus seq_len - 1 (ALiBi)
  int s_off;            // float2 index of the owned row's first pair in the score buffer
  int w_off;            // word index of its first pair in the weight buffer
  // Byte offsets, from a stage's K / V part, of this lane's ldmatrix row addresses (decode_policy.hpp).
  int k_off[LK];
  int v_off[LV];

  // The exchange buffer (TcPass1Policy::kExchangeBytes, inside the kernel's one shared array,
  // pass1_shared): partial scores [warp][lane]; weights as A fragments [part][p.v step][lane];
  // rescale factors of rows (g, g + 8) [g]. (fp8 with bf16 q: init's row maxima, in the scores.)
  __device__ __forceinline__ static float4* exchange() { return reinterpret_cast<float4*>(pass1_exchange<P>()); }
  __device__ __forceinline__ static float4* scores() { return exchange(); }
  __device__ __forceinline__ static uint4* weights() {
    return reinterpret_cast<uint4*>(exchange() + P::kScoreBytes / 16);
  }
  __device__ __forceinline__ static float2* factors() {
    return reinterpret_cast<float2*>(exchange() + (P::kScoreBytes + P::kWeightBytes) / 16);
  }

  /// q staging (init -> ready): the block's 16 rows of q in the last stage, free until the main
  /// loop's first issue (after two barriers). kQChunks 16-byte chunks a row; chunk c of row r at
  /// c ^ (r % 8) where rows hold whole groups of 8 (ldmatrix's 8 rows then meet 8 bank groups).
  static constexpr int kQChunks = 2 * KS;
  /// Staged where the static report shows the main loop unchanged by it; at heads 64, 80 and 112
  /// the staged q cost 4-11 % more main-loop instructions per KV byte (and spills at 112, vLLM
  /// layout), so those keep one 4-byte load per fragment register.
  static constexpr bool kStagedQ = !(D == 64 || D == 80 || D == 112);
  static_assert(16 * kQChunks * 16 <= P::kStageBytes, "q's 16 rows fit one stage");
  __device__ __forceinline__ static char* q_stage() { return pass1_shared<P>() + (P::kStages - 1) * P::kStageBytes; }
  __device__ __forceinline__ static int q_chunk(int r, int c) { return kQChunks % 8 == 0 ? c ^ (r & 7) : c; }

  /// Query rows of this block (DecodeParams::group_size: q_group heads x q_len tokens), the first
  /// one's index among its KV head's rows, and the KV head.
  struct Rows {
    int count;
    int v0;
    int kv_head;
    /// Query head and q / out row (of sequence seq) of the block's row r.
    __device__ __forceinline__ int head(const DecodeParams& p, int r) const { return q_row_head(p, kv_head, v0 + r); }
    __device__ __forceinline__ int io_row(const DecodeParams& p, int seq, int r) const {
      return seq * p.q_len + q_row_token(p, v0 + r);
    }
    /// Row r holds a query (not past the block's rows, not a padding slot of q_len > 1).
    __device__ __forceinline__ bool real(const DecodeParams& p, int r) const { return r < count && q_row_real(p, v0 + r); }
  };
  __device__ __forceinline__ static Rows rows(const DecodeParams& p) {
    const BlockHeads bh = block_heads(p);
    const int first = bh.chunk * p.heads_per_block;
    const int left = p.group_size - first;
    return Rows{p.heads_per_block < left ? p.heads_per_block : left, first, bh.kv_head};
  }

  /// The softmax row (0..15) lane `lane` of warp `warp` owns, and its first token pair.
  __device__ __forceinline__ static int owned_row(int warp, int lane) { return 4 * warp + (lane % P::kSoftmaxLanes) / LPR; }
  __device__ __forceinline__ static int owned_pair(int lane) { return (lane % LPR) * PPL; }
  /// Word index, in the weight buffer's first part, of softmax row `row`'s weights of tokens c0,
  /// c0 + 1 (c0 even) as A fragments: step c0 / 16, lane 4 (row % 8) + (k % 8) / 2, register
  /// row / 8 + 2 (k / 8), k = tc_weight_k(c0 % 16) (the pair shares one word: k is even).
  __device__ __forceinline__ static int weight_word(int row, int c0) {
    const int k = tc_weight_k<P, kLayout>(c0 % 16);
    return 4 * ((c0 / 16) * 32 + 4 * (row % 8) + (k % 8) / 2) + row / 8 + 2 * (k / 8);
  }

  /// fp8 with bf16 q: q converted to fp16 per row by 2^s (math::fp8_q_shift of the row's largest
  /// magnitude; exchange buffer and one barrier, since the warps split the k-steps). Returns 2^-s of
  /// softmax row `row`.
  __device__ __forceinline__ float q_to_fp16(int warp, int g, int t, int row) {
    float mx[2] = {0.0f, 0.0f};  // rows g, g + 8
#pragma unroll
    for (int i = 0; i < KSW; ++i)
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const float2 v = bf16_pair(qa[i][reg]);
        mx[reg & 1] = fmaxf(mx[reg & 1], fmaxf(fabsf(v.x), fabsf(v.y)));
      }
#pragma unroll
    for (int o = 1; o < 4; o *= 2) {
      mx[0] = fmaxf(mx[0], __shfl_xor_sync(kFullMask, mx[0], o));
      mx[1] = fmaxf(mx[1], __shfl_xor_sync(kFullMask, mx[1], o));
    }
    float* tab = reinterpret_cast<float*>(exchange());  // [k-step group][row]
    if (warp % NN == 0 && t == 0) {
      tab[(warp / NN) * 16 + g] = mx[0];
      tab[(warp / NN) * 16 + g + 8] = mx[1];
    }
    __syncthreads();
    auto row_max = [&](int r) {
      float v = tab[r];
#pragma unroll
      for (int k = 1; k < KSPLIT; ++k) v = fmaxf(v, tab[k * 16 + r]);
      return v;
    };
    const float up[2] = {math::pow2f(math::fp8_q_shift(row_max(g))), math::pow2f(math::fp8_q_shift(row_max(g + 8)))};
#pragma unroll
    for (int i = 0; i < KSW; ++i)
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const float2 v = bf16_pair(qa[i][reg]);
        qa[i][reg] = pack_pair<__half>(v.x * up[reg & 1], v.y * up[reg & 1]);
      }
    return math::pow2f(-math::fp8_q_shift(row_max(row)));
  }

  /// Loads this warp's q fragments and its softmax row's constants; every warp takes part.
  __device__ __forceinline__ bool init(const DecodeParams& p, int seq, int seq_len) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int g = lane >> 2;
    const int t = lane & 3;
    const Rows r = rows(p);
    scale2 = p.scale2;
    vscale = 1.0f;
    const int row = owned_row(warp, lane);
    // The owned row's length: its query sits at seq_len - q_len + its token (padded rows: seq_len).
    const int row_len = r.real(p, row) ? math::row_len(seq_len, p.q_len, q_row_token(p, r.v0 + row)) : seq_len;
    slope2 = p.alibi_slopes != nullptr && r.real(p, row) ? p.alibi_slopes[r.head(p, row)] * math::kLog2e : 0.0f;
    m = math::neg_inf();
    // Pair q of the owned row holds tokens c = 2q, 2q + 1: n-tile c / 8, C-fragment lane
    // 4 (row % 8) + (c % 8) / 2, registers 2 (row / 8), +1 (a float2); as A fragments, weight_word.
    // The lane's PPL pairs are consecutive, so the others are at +1 float2 / +kPairWords words.
    const int c0 = 2 * owned_pair(lane);
    pos_off = c0 - (row_len - 1);
    const int fl = 4 * (row % 8) + (c0 % 8) / 2;
    s_off = 2 * ((c0 / 8) * 32 + fl) + row / 8;
    w_off = weight_word(row, c0);
#pragma unroll
    for (int i = 0; i < NTW; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
    lsum[0] = lsum[1] = 0.0f;
    // a[reg]: row g + 8 (reg & 1), columns 16 ks + 8 (reg >> 1) + 2t, +1 (one 32-bit word); fp8:
    // columns 16 ks + 4t + 2 (reg >> 1), +1 (the K fragments' permutation).
    // Rows g and g + 8: each its own q row (token) and head, as 32-bit offsets from the sequence's
    // first row (q_len rows of q_stride elements: far below 2^31).
    // q into the last stage (q_stage), 32 bytes (one k-step of a row) per thread and step: 16-byte
    // loads instead of a 4-byte load per fragment register (~200 instructions of every block's
    // prologue); ready() reads the fragments with ldmatrix after the prologue's barrier.
    const T* qs = static_cast<const T*>(p.q) + static_cast<int64_t>(seq) * p.q_len * p.q_stride;
    if constexpr (!kStagedQ) {
      int qoff[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int v = r.v0 + (r.real(p, g + 8 * h) ? g + 8 * h : 0);
        qoff[h] = q_row_token(p, v) * static_cast<int>(p.q_stride) + r.head(p, v - r.v0) * D;
      }
      const int ks0 = (warp / NN) * KSW;
#pragma unroll
      for (int i = 0; i < KSW; ++i)
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          const int qrow = g + 8 * (reg & 1);
          const int col = 16 * (ks0 + i) + (kFp8 ? 4 * t + 2 * (reg >> 1) : 8 * (reg >> 1) + 2 * t);
          qa[i][reg] = ks0 + i < KS && r.real(p, qrow)
                           ? __ldg(reinterpret_cast<const uint32_t*>(qs + qoff[reg & 1] + col))
                           : 0u;
        }
    }
#pragma unroll
    for (int u = 0; kStagedQ && u < (16 * KS + P::kThreads - 1) / P::kThreads; ++u) {
      const int item = static_cast<int>(threadIdx.x) + u * P::kThreads;
      if ((16 * KS) % P::kThreads != 0 && item >= 16 * KS) break;
      const int qr = item % 16, ks = item / 16;
      uint4 lo{0u, 0u, 0u, 0u}, hi{0u, 0u, 0u, 0u};
      if (r.real(p, qr)) {
        const uint4* src = reinterpret_cast<const uint4*>(
            qs + q_row_token(p, r.v0 + qr) * static_cast<int64_t>(p.q_stride) + r.head(p, qr) * D + 16 * ks);
        lo = __ldg(src);
        hi = __ldg(src + 1);
      }
      if constexpr (kFp8) {  // the K fragments' permutation: column pair j at slot 4 (j & 1) + j / 2
        const uint4 a = lo, b = hi;
        lo = uint4{a.x, a.z, b.x, b.z};
        hi = uint4{a.y, a.w, b.y, b.w};
      }
      uint4* row_chunks = reinterpret_cast<uint4*>(q_stage()) + qr * kQChunks;
      row_chunks[q_chunk(qr, 2 * ks)] = lo;
      row_chunks[q_chunk(qr, 2 * ks + 1)] = hi;
    }
    if constexpr (kFp8 && !kStagedQ) fp8_scales(p, warp, lane);
#pragma unroll
    for (int a = 0; a < LK; ++a) k_off[a] = tc_k_ldm_offset<P, kLayout>(warp, lane, a);
#pragma unroll
    for (int a = 0; a < LV; ++a) v_off[a] = tc_v_ldm_offset<P, kLayout>(warp, lane, a);
    return true;
  }

  /// After the prologue's barrier (init's q stores visible): this warp's q fragments by ldmatrix
  /// (zero past D), then fp8's q conversion and scales. Every warp takes part (a barrier for fp8
  /// with bf16 q).
  __device__ __forceinline__ void ready(const DecodeParams& p) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int ks0 = (warp / NN) * KSW;
    // ldmatrix .x4 of one k-step: lane l addresses row 8 (l / 8 % 2) + l % 8, chunk 2 ks + l / 16:
    // registers (row g, cols 2t), (g + 8, 2t), (g, 8 + 2t), (g + 8, 8 + 2t), the A fragment.
    const int lr = 8 * ((lane >> 3) & 1) + (lane & 7);
    const uint4* row_chunks = reinterpret_cast<const uint4*>(q_stage()) + lr * kQChunks;
#pragma unroll
    for (int i = 0; kStagedQ && i < KSW; ++i) {
      if (!kPaddedKSteps || ks0 + i < KS) {  // warp-uniform
        dev::ldmatrix<4, false>(qa[i], dev::smem_addr(row_chunks + q_chunk(lr, 2 * (ks0 + i) + (lane >> 4))));
      } else {
        qa[i][0] = qa[i][1] = qa[i][2] = qa[i][3] = 0u;
      }
    }
    if constexpr (kFp8 && kStagedQ) fp8_scales(p, warp, lane);
  }

  /// fp8: q converted to fp16 (bf16 q) and the row's scales, once q's fragments are loaded.
  __device__ __forceinline__ void fp8_scales(const DecodeParams& p, int warp, int lane) {
    // NOTE(graph): the scales are read from memory here, so a replay sees what was written last.
    const int si = p.scale_per_head ? block_heads(p).kv_head : 0;
    const float unshift = p.io_bf16 ? q_to_fp16(warp, lane >> 2, lane & 3, owned_row(warp, lane)) : 1.0f;  // block-uniform
    scale2 = math::fp8_scale2(p.scale, __ldg(p.k_scale + si), unshift);
    vscale = __ldg(p.v_scale + si);
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

  /// A logit of the owned token at `pos`, masked: outside the row's window and after its query
  /// (q_len > 1) in every tile, by its distance rel = pos - the query's position (math::attends;
  /// rel comes from pos_off, the ALiBi term's), and at or past `end` only kMasked (the partition's
  /// last tile, the only one reaching it). Logits are formed (math::logit2) and soft-capped (after
  /// scale and bias, before the masks) in consume.
  template <bool kMasked>
  __device__ __forceinline__ static float mask(const DecodeParams& p, float s, int pos, int rel, int end) {
    return (kMasked && pos >= end) || !math::attends(rel, p.window_span) ? math::neg_inf() : s;
  }

  /// First half of a tile [tile_start, tile_start + NTOK) (tokens at or past `end` masked when
  /// kMasked): q.k, the score exchange (a block barrier: every warp calls it for every tile), the
  /// softmax of this warp's rows and the weights' store. sk / sv: shared addresses of the stage's K
  /// and V parts. The driver's barrier then publishes the weights; accumulate(sv) folds them in.
  template <bool kMasked>
  __device__ __forceinline__ void consume(const DecodeParams& p, dev::SmemAddr sk, dev::SmemAddr /*sv*/, int tile_start, int end) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) / 32;

    // Partial q.k of token n-tile warp % NN over this warp's k-steps (matrix 2i + b: B register b
    // of k-step i; fp8: matrix i holds both registers of k-step i, two cvt).
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t b0 = 0u;
    const int ks0 = (warp / NN) * KSW;
    for_matrices<MK, false>(sk, k_off, [&](int mu, uint32_t b) {
      if constexpr (kFp8) {
        if (mu < KSW && (!kPaddedKSteps || ks0 + mu < KS)) {  // warp-uniform
          uint32_t b1;
          dev::fp8x4_to_half2x2<KV>(b, b0, b1);
          dev::mma_m16n8k16<T>(s, qa[mu], b0, b1);
        }
      } else if (mu % 2 == 0) {
        b0 = b;
      } else if (!kPaddedKSteps || ks0 + mu / 2 < KS) {  // warp-uniform
        dev::mma_m16n8k16<T>(s, qa[mu / 2], b0, b);
      }
    });
    float4* x = scores();
    x[warp * 32 + lane] = float4{s[0], s[1], s[2], s[3]};
    __syncthreads();

    // The owned pairs' scores: n-tile j's partials come from warps j, j + NN, ..., summed in that
    // order. Then the logits, the row max over the row's LPR lanes, the online step.
    const float2* x2 = reinterpret_cast<const float2*>(x);
    float sc[2 * PPL];
    // rel0: the first owned token's position minus the row's query position (<= 0 where it is
    // attended); bias0 its ALiBi term, slope2 * rel0; pos0 its position (for the masks).
    const int rel0 = tile_start + pos_off;
    const float bias0 = slope2 * static_cast<float>(rel0);
    const int pos0 = tile_start + 2 * owned_pair(lane);
    float mx = math::neg_inf();
#pragma unroll
    for (int i = 0; i < PPL; ++i) {
      float2 v = x2[s_off + 2 * i];
#pragma unroll
      for (int kp = 1; kp < KSPLIT; ++kp) {
        const float2 o = x2[s_off + 2 * i + 2 * 32 * NN * kp];
        v.x += o.x;
        v.y += o.y;
      }
      // Without fp8 the scale is the launch's (a constant operand, no register).
      const float sc2 = kFp8 ? scale2 : p.scale2;
      sc[2 * i] = math::logit2(v.x, sc2, bias0 + slope2 * static_cast<float>(2 * i));
      sc[2 * i + 1] = math::logit2(v.y, sc2, bias0 + slope2 * static_cast<float>(2 * i + 1));
    }
    // One uniform branch for all of the thread's logits, so that a layer without a cap skips the
    // whole block (per logit, ptxas predicated it and the uncapped loop paid for it).
    if (p.cap2 > 0.0f) {
#pragma unroll
      for (int i = 0; i < 2 * PPL; ++i) sc[i] = softcap2_dev(sc[i], p.cap2, p.cap2_k);
    }
#pragma unroll
    for (int i = 0; i < 2 * PPL; ++i) {
      sc[i] = mask<kMasked>(p, sc[i], pos0 + i, rel0 + i, end);
      mx = fmaxf(mx, sc[i]);
    }
#pragma unroll
    for (int o = 1; o < LPR; o *= 2) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, o));
    const math::MaxStep st = math::online_max2(m, mx);
    const float f = st.moved ? dev::ex2(m - st.sub) : 1.0f;
    m = st.m;
    const float sub = st.sub - kShift;

    // The weights as A fragments: hi = rn(p) (and lo = rn(p - hi)); the row's rescale factor.
    uint32_t* w = reinterpret_cast<uint32_t*>(weights());
    const bool stores = P::kSoftmaxLanes == 32 || lane < P::kSoftmaxLanes;
#pragma unroll
    for (int i = 0; i < PPL; ++i) {
      const float p0 = dev::ex2(sc[2 * i] - sub);
      const float p1 = dev::ex2(sc[2 * i + 1] - sub);
      const uint32_t hi = pack_pair<T>(p0, p1);
      if (stores) w[w_off + kPairWords * i] = hi;
      if constexpr (WP == 2) {
        const float2 h = unpack_pair(hi);
        const uint32_t lo = pack_pair<T>(p0 - h.x, p1 - h.y);
        if (stores) w[w_off + kPairWords * i + KT * 32 * 4] = lo;
      }
    }
    const int row = owned_row(warp, lane);
    if (stores && lane % LPR == 0) reinterpret_cast<float*>(factors())[2 * (row % 8) + row / 8] = f;
  }

  /// Second half of a tile, after the driver's barrier: rescales the output by the rows' factors
  /// and adds the weights times V (sv: the stage's V part) and times ones (the weights' sum).
  __device__ __forceinline__ void accumulate(dev::SmemAddr sv) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const float2 f = factors()[lane >> 2];
#pragma unroll
    for (int i = 0; i < NTW; ++i) {
      acc[i][0] *= f.x;
      acc[i][1] *= f.x;
      acc[i][2] *= f.y;
      acc[i][3] *= f.y;
    }
    lsum[0] *= f.x;
    lsum[1] *= f.y;
    // A fragments: pa[part][kt]. 8-token tiles (NN = 1) have no tokens 8..15, so k 8..15 of the
    // step carry the lo parts instead (registers 2, 3 = lo's 0, 1; B's upper half repeats V):
    // one mma folds hi.V + lo.V.
    constexpr int kParts = NN > 1 ? WP : 1;
    uint32_t pa[kParts][KT][4];
    const uint4* w = weights();
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      if constexpr (NN > 1) {
#pragma unroll
        for (int part = 0; part < WP; ++part) {
          const uint4 v = w[(part * KT + kt) * 32 + lane];
          pa[part][kt][0] = v.x;
          pa[part][kt][1] = v.y;
          pa[part][kt][2] = v.z;
          pa[part][kt][3] = v.w;
        }
      } else {
        const uint32_t* hi = reinterpret_cast<const uint32_t*>(w + kt * 32 + lane);
        pa[0][kt][0] = hi[0];
        pa[0][kt][1] = hi[1];
        if constexpr (WP == 2) {
          const uint32_t* lo = reinterpret_cast<const uint32_t*>(w + (KT + kt) * 32 + lane);
          pa[0][kt][2] = lo[0];
          pa[0][kt][3] = lo[1];
        } else {
          pa[0][kt][2] = 0u;
          pa[0][kt][3] = 0u;
        }
      }
    }
    if constexpr (kFp8 && kLayout == KVLayout::kNHD) {
      // Matrix mu = (kt * NTW / 2 + j) * 2 + h: tokens 16 kt + 8 h .. + 7 of chunk j's 16 d, read
      // transposed; interleave_pairs and one cvt pair give B half h of d-tiles 2j (even d) and
      // 2j + 1 (odd d).
      uint32_t e0 = 0u, o0 = 0u;
      for_matrices<MV, true>(sv, v_off, [&](int mu, uint32_t b) {
        const int pair = mu / 2;
        const int kt = pair / (NTW / 2);
        const int j = pair % (NTW / 2);
        uint32_t e, o;
        dev::fp8x4_to_half2x2<KV>(dev::interleave_pairs(b), e, o);
        if (mu % 2 == 0) {
          e0 = e;
          o0 = o;
          return;
        }
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
          dev::mma_m16n8k16<T>(acc[2 * j], pa[part][kt], e0, e);
          dev::mma_m16n8k16<T>(acc[2 * j + 1], pa[part][kt], o0, o);
        }
      });
    } else if constexpr (kFp8) {
      // Matrix mu = kt * NTW + i: d-tile i's 8 d-rows of token group kt; one cvt pair gives both B
      // registers (tokens permuted as the weights are, tc_weight_k).
      for_matrices<MV, false>(sv, v_off, [&](int mu, uint32_t b) {
        uint32_t b0, b1;
        dev::fp8x4_to_half2x2<KV>(b, b0, b1);
#pragma unroll
        for (int part = 0; part < kParts; ++part) dev::mma_m16n8k16<T>(acc[mu % NTW], pa[part][mu / NTW], b0, b1);
      });
    } else {
      // Matrix mu = (kt * NTW + i) * H + h is B register h of d-tile i's step kt.
      uint32_t v0 = 0u;
      for_matrices<MV, kLayout == KVLayout::kNHD>(sv, v_off, [&](int mu, uint32_t b) {
        const int kt = mu / H / NTW;
        const int i = mu / H % NTW;
        if (H == 2 && mu % 2 == 0) {
          v0 = b;
          return;
        }
        const uint32_t b0 = H == 1 ? b : v0;
        const uint32_t b1 = H == 1 ? (WP == 2 ? b : 0u) : b;
#pragma unroll
        for (int part = 0; part < kParts; ++part) dev::mma_m16n8k16<T>(acc[i], pa[part][kt], b0, b1);
      });
    }
    // The weights' row sums, as the products used them: C registers 0 and 2 (rows g, g + 8); 1
    // and 3 hold the same sums again and are not kept.
    float ls[4] = {lsum[0], 0.0f, lsum[1], 0.0f};
#pragma unroll
    for (int kt = 0; kt < KT; ++kt)
#pragma unroll
      for (int part = 0; part < kParts; ++part) dev::mma_m16n8k16<T>(ls, pa[part][kt], kOnes, kOnes);
    lsum[0] = ls[0];
    lsum[1] = ls[2];
  }

  /// Nothing left to merge: every lane holds l of rows g, g + 8 (lsum), the owners the rows' max.
  /// V1 with sinks: each row's sink joins lsum on the weights' scale (math::sink_fold2: the max
  /// becomes max(m, sink log2(e)); where the sink raises it, lsum is rescaled and the output too,
  /// by oscale in write, so that acc is never touched here);
  /// the owners publish m through the factors buffer (two block barriers, block-uniform: every
  /// warp takes part).
  __device__ __forceinline__ void finish(const DecodeParams& p) {
    oscale[0] = oscale[1] = 1.0f;
    if (p.write_partials || p.sinks == nullptr) return;
    // static-report: begin sinks
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int row = owned_row(warp, lane);
    __syncthreads();  // every warp has read the last tile's factors
    if ((P::kSoftmaxLanes == 32 || lane < P::kSoftmaxLanes) && lane % LPR == 0)
      reinterpret_cast<float*>(factors())[2 * (row % 8) + row / 8] = m;
    __syncthreads();
    const float2 mr = factors()[lane >> 2];  // the maxima of rows g, g + 8
    const Rows r = rows(p);
    // NOTE(graph): the sinks are read from memory.
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (r.real(p, (lane >> 2) + 8 * h)) {
        const math::SinkFold sf = math::sink_fold2(__ldg(p.sinks + r.head(p, (lane >> 2) + 8 * h)), h ? mr.y : mr.x, kShift);
        lsum[h] = lsum[h] * sf.f + sf.term;  // f = 1 (exact) unless the sink raises the row's max
        oscale[h] = sf.f;
      }
    // static-report: end sinks
  }

  /// After finish (poison_edge): row g or g + 8 of this lane becomes NaN (its l: output and V2
  /// partial NaN) where pred(its query position) holds.
  template <class F>
  __device__ __forceinline__ void poison_rows(const DecodeParams& p, int len, F&& pred) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const Rows r = rows(p);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = (lane >> 2) + 8 * h;
      if (r.real(p, row) && pred(math::row_len(len, p.q_len, q_row_token(p, r.v0 + row)) - 1))
        lsum[h] = bits_float(0x7fc00000u);
    }
  }

  /// An output value: acc / l (fp8: times v_scale).
  __device__ __forceinline__ float out_value(float a, float l) const {
    if constexpr (kFp8) return math::normalise(a, l) * vscale;
    return math::normalise(a, l);
  }
  /// Two output values packed in the output dtype (fp8: fp16 or bf16 by p.io_bf16).
  __device__ __forceinline__ static uint32_t pack_out(const DecodeParams& p, float a, float b) {
    if constexpr (kFp8) {
      if (p.io_bf16) return pack_pair<__nv_bfloat16>(a, b);
    }
    return pack_pair<T>(a, b);
  }

  /// Each warp writes its d-tiles of the block's real rows: V1 the normalised output, V2 the
  /// partial (m in natural units from the row's softmax owner, l unscaled from warp 0, acc / l).
  /// d of C register e of d-tile i: 8 dt + 2t + (e & 1) (dt = warp * NTW + i); fp8 NHD: d-tiles
  /// 2j, 2j + 1 hold the even and odd d of chunk c = warp * NTW / 2 + j, so a lane writes d
  /// 16 c + 4t .. + 3.
  __device__ __forceinline__ void write(const DecodeParams& p, int seq, int part) const {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int g = lane >> 2;
    const int t = lane & 3;
    const Rows r = rows(p);
    if (p.write_partials) {
      // static-report: begin v2-write
      const int row = owned_row(warp, lane);
      if (lane % LPR == 0 && lane < P::kSoftmaxLanes && r.real(p, row))
        p.max_logits[math::partial_index(r.io_row(p, seq, row), r.head(p, row), part, p.num_q_heads, p.max_partitions)] =
            m * math::kLn2;  // back to natural logits for the merge
      // static-report: end v2-write
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = g + 8 * h;
      if (!r.real(p, row)) continue;
      const int q_head = r.head(p, row);
      const int io = r.io_row(p, seq, row);
      const float l = lsum[h];
      if (p.write_partials) {
        // static-report: begin v2-write
        const int64_t idx = math::partial_index(io, q_head, part, p.num_q_heads, p.max_partitions);
        if (warp == 0 && t == 0) p.exp_sums[idx] = kFp16 ? l * (1.0f / (1 << math::kTcWeightShiftFp16)) : l;
        float* dst = p.partial_out + idx * D;
        if constexpr (kFp8 && kLayout == KVLayout::kNHD) {
#pragma unroll
          for (int j = 0; j < NTW / 2; ++j) {
            const int c = warp * (NTW / 2) + j;
            if (c < P::kChunksPerToken)
              *reinterpret_cast<float4*>(dst + 16 * c + 4 * t) =
                  float4{out_value(acc[2 * j][2 * h], l), out_value(acc[2 * j + 1][2 * h], l),
                         out_value(acc[2 * j][2 * h + 1], l), out_value(acc[2 * j + 1][2 * h + 1], l)};
          }
        } else {
#pragma unroll
          for (int i = 0; i < NTW; ++i) {
            const int dt = warp * NTW + i;
            if (NTW * P::kWarps == NDT || dt < NDT)
              *reinterpret_cast<float2*>(dst + 8 * dt + 2 * t) =
                  float2{out_value(acc[i][2 * h], l), out_value(acc[i][2 * h + 1], l)};
          }
        }
        // static-report: end v2-write
      } else {
        // static-report: begin v1-write
        T* dst = static_cast<T*>(p.out) + static_cast<int64_t>(io) * p.out_stride + static_cast<int64_t>(q_head) * D;
        const float os = oscale[h];
        if constexpr (kFp8 && kLayout == KVLayout::kNHD) {
#pragma unroll
          for (int j = 0; j < NTW / 2; ++j) {
            const int c = warp * (NTW / 2) + j;
            if (c < P::kChunksPerToken)
              *reinterpret_cast<uint2*>(dst + 16 * c + 4 * t) =
                  uint2{pack_out(p, out_value(acc[2 * j][2 * h], l) * os, out_value(acc[2 * j + 1][2 * h], l) * os),
                        pack_out(p, out_value(acc[2 * j][2 * h + 1], l) * os, out_value(acc[2 * j + 1][2 * h + 1], l) * os)};
          }
        } else {
#pragma unroll
          for (int i = 0; i < NTW; ++i) {
            const int dt = warp * NTW + i;
            if (NTW * P::kWarps == NDT || dt < NDT)
              *reinterpret_cast<uint32_t*>(dst + 8 * dt + 2 * t) =
                  pack_out(p, out_value(acc[i][2 * h], l) * os, out_value(acc[i][2 * h + 1], l) * os);
          }
        }
        // static-report: end v1-write
      }
    }
  }

  /// The two elements of a packed pair (pack_pair's order) as floats, exactly.
  __device__ __forceinline__ static float2 unpack_pair(uint32_t w) {
    if constexpr (kFp16) {
      __half2 h;
      memcpy(&h, &w, sizeof h);
      return __half22float2(h);
    } else {
      return bf16_pair(w);
    }
  }
  __device__ __forceinline__ static float2 bf16_pair(uint32_t w) {
    return float2{decodegraph::bits_float(w << 16), decodegraph::bits_float(w & 0xffff0000u)};
  }
};

// ---------------------------------------------------------------- launchers (inst/decode_tc_*.cu, inst/decode_fp8*.cu)

template <typename T, typename KV, int D, KVLayout kLayout>
void enqueue_paged_decode_tc(const DecodeParams& p, cudaStream_t stream, const char* name) {
  enqueue_paged_decode<T, KV, D, kLayout, TensorCoreMath>(p, TcPass1Policy<sizeof(KV), D>::kThreads, stream, name);
}

template <typename T, typename KV, int D, KVLayout kLayout>
int paged_decode_tc_blocks_per_sm() {
  return paged_decode_kernel_blocks_per_sm<T, KV, D, kLayout, TensorCoreMath>(TcPass1Policy<sizeof(KV), D>::kThreads);
}

}  // namespace decodegraph::kernels
