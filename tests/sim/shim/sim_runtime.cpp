#include "sim_runtime.hpp"

#include "decodegraph/numeric.hpp"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;


const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorSim"; }
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

namespace {
struct Alloc { char* base; size_t map_bytes; size_t n; };
std::map<uintptr_t, Alloc> g_allocs;  // keyed by user pointer
}

cudaError_t cudaMalloc(void** p, size_t n) {
  const size_t n16 = (std::max<size_t>(n, 1) + 15) / 16 * 16;
  const size_t pages = (n16 + 4095) / 4096;
  const size_t map_bytes = (pages + 2) * 4096;
  char* base = static_cast<char*>(mmap(nullptr, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED) return cudaErrorNoDevice;
  mprotect(base + 4096, pages * 4096, PROT_READ | PROT_WRITE);
  char* user = base + 4096 + pages * 4096 - n16;
  if (n16 < (size_t{1} << 28)) memset(user, 0xa5, n16);  // garbage, like fresh device memory
  g_allocs[reinterpret_cast<uintptr_t>(user)] = Alloc{base, map_bytes, n16};
  *p = user;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end()) return cudaSuccess;
  munmap(it->second.base, it->second.map_bytes);
  g_allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { memcpy(d, s, n); return cudaSuccess; }
cudaError_t cudaMemset(void* d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }

namespace sim {
namespace {
struct Copy {
  void* dst;
  const void* src;
  int bytes;
  long group;
};
struct Access {
  unsigned site;
  unsigned occurrence;  // how many accesses this thread made at `site` before, in this interval
  uintptr_t addr;
};
struct Fiber {
  std::vector<Access> accesses;                        // shared accesses since the last barrier
  std::vector<std::pair<unsigned, unsigned>> by_site;  // site -> accesses so far in this interval
  ucontext_t uc;
  jmp_buf jb;
  bool started = false, done = false;
  int tid = 0;
  char* stack = nullptr;
  std::vector<Copy> copies;  // cp.async issued, not yet landed
  long committed = 0;        // groups committed so far; the open group has this index
};
constexpr size_t kStack = 256 * 1024;
std::vector<Fiber> fibers;
std::vector<std::pair<void*, size_t>> g_shared;
jmp_buf sched_jb;
Fiber* cur = nullptr;
const std::function<void()>* body = nullptr;
int nthreads = 0;
long progress = 0;
int bar_arrived = 0;
long bar_gen = 0;
long barriers_done = 0;
struct Warp {
  int arrived = 0;
  long gen = 0;
  int kind = 0;
  unsigned site = 0;  // call site of a payload collective (0 for the shuffles and syncwarp)
  float vals[32], snap[32];
  unsigned char in[32][64], out[32][64];  // payload collectives (ldmatrix, mma)
};
std::vector<Warp> warps;
std::mt19937_64 rng(std::getenv("DECODEGRAPH_SIM_SEED") ? std::strtoull(std::getenv("DECODEGRAPH_SIM_SEED"), nullptr, 10) : 1);
Order g_order = Order::kFromEnv;
// 0 forward, 1 reverse, 2 shuffled per scheduling round.
int order_mode() {
  switch (g_order) {
    case Order::kForward: return 0;
    case Order::kReverse: return 1;
    case Order::kShuffle: return 2;
    case Order::kFromEnv: break;
  }
  const char* o = std::getenv("DECODEGRAPH_SIM_ORDER");
  if (!o || !strcmp(o, "fwd")) return 0;
  if (!strcmp(o, "rev")) return 1;
  if (!strcmp(o, "shuffle")) return 2;
  fail(std::string("DECODEGRAPH_SIM_ORDER=") + o + ": expected fwd, rev or shuffle");
  return 0;
}

std::string where() {
  char b[160];
  snprintf(b, sizeof b, "block (%u,%u,%u) thread %u of %d", blockIdx.x, blockIdx.y, blockIdx.z,
           threadIdx.x, nthreads);
  return b;
}
void yield() {
  if (!_setjmp(cur->jb)) _longjmp(sched_jb, 1);
}
void trampoline() {
  (*body)();
  if (!cur->copies.empty())
    fail("thread exited with " + std::to_string(cur->copies.size()) +
         " cp.async copies it never waited for (missing cp.async.wait_group) at " + where());
  cur->done = true;
  ++progress;
  _longjmp(sched_jb, 1);
}
// kind 1: xor shuffle (arg = offset), 2: syncwarp, 3: indexed shuffle (arg = source lane within
// segments of `width` lanes).
float warp_op(int kind, unsigned mask, float v, int arg, int width = 32) {
  if (mask != 0xffffffffu) fail("warp op with a partial mask at " + where());
  if (nthreads % 32 != 0) fail("warp op in a partial warp at " + where());
  if (arg < 0 || arg >= 32) fail("bad shuffle offset or lane at " + where());
  const int tid = static_cast<int>(threadIdx.x);
  Warp& w = warps[tid / 32];
  const int lane = tid % 32;
  if (w.arrived == 0) {
    w.kind = kind;
    w.site = 0;
  } else if (w.kind != kind || w.site != 0) {
    fail("lanes of one warp meet different warp ops at " + where());
  }
  const long g = w.gen;
  w.vals[lane] = v;
  ++w.arrived;
  ++progress;
  if (w.arrived == 32) {
    memcpy(w.snap, w.vals, sizeof w.vals);
    w.arrived = 0;
    ++w.gen;
  } else {
    while (w.gen == g) yield();
  }
  if (kind == 3) return w.snap[(lane & ~(width - 1)) | (arg & (width - 1))];
  return w.snap[lane ^ arg];
}
}  // namespace

// ---------------------------------------------------------------- tensor cores
// ldmatrix and mma.sync are warp-collective: every lane deposits its operands, the 32nd to arrive
// computes all lanes' results, each lane takes its own. All 32 lanes must arrive at the same call
// site with the same operation (kind); a lane that never arrives deadlocks the block (reported), a
// partial warp fails. Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
// point type", Figures 79, 81 and 83; "ldmatrix", the 8x8 fragment figure), g = lane / 4, t = lane % 4:
//   A a[0..3]: (row g, cols 2t, 2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)
//   B b0, b1:  (rows k = 2t, 2t+1, col g), (k = 2t + 8, 2t + 9, col g)
//   C/D d[0..3]: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
//   ldmatrix: lane l addresses row l % 8 of matrix l / 8; register m of lane (g, t) holds
//   elements (row g, cols 2t, 2t+1) of matrix m, or with .trans (rows 2t, 2t+1; col g).
// Two 16-bit elements share a register, the lower-indexed one in the low half.
// mma arithmetic: products of fp16 / bf16 are exact in fp32; they are summed onto C in k order in
// fp32. The tensor cores' own summation order and rounding are not modelled (results are close to,
// not bitwise equal to, the GPU's).
namespace {
enum : int { kKindMmaBf16 = 16, kKindMmaF16 = 17, kKindLdsm = 32 };  // + (num << 1 | trans) for ldmatrix
long g_mma_count = 0;

using Payload = unsigned char[64];
using Collective = void (*)(const Payload* in, Payload* out, int arg);

void warp_collective(int kind, unsigned site, const void* in, size_t n_in, void* out, size_t n_out,
                     Collective fn, int arg) {
  if (nthreads % 32 != 0) fail("warp op in a partial warp at " + where());
  const int tid = static_cast<int>(threadIdx.x);
  Warp& w = warps[tid / 32];
  const int lane = tid % 32;
  if (w.arrived == 0) {
    w.kind = kind;
    w.site = site;
  } else if (w.kind != kind || w.site != site) {
    fail("lanes of one warp meet different warp ops (ldmatrix / mma at line " + std::to_string(site) + ") at " +
         where());
  }
  memcpy(w.in[lane], in, n_in);
  const long g = w.gen;
  ++w.arrived;
  ++progress;
  if (w.arrived == 32) {
    fn(w.in, w.out, arg);
    w.arrived = 0;
    ++w.gen;
  } else {
    while (w.gen == g) yield();
  }
  memcpy(out, w.out[lane], n_out);
}

uint16_t half_of(uint32_t reg, int hi) { return static_cast<uint16_t>(hi ? reg >> 16 : reg & 0xffffu); }

struct MmaIn {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
};

void mma_compute(const Payload* in, Payload* out, int bf16) {
  auto elem = [&](uint32_t reg, int hi) {
    const uint16_t bits = half_of(reg, hi);
    return bf16 ? decodegraph::bf16_bits_to_float(bits) : decodegraph::fp16_bits_to_float(bits);
  };
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    MmaIn v;
    memcpy(&v, in[lane], sizeof v);
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 2; ++e) {
      A[g][2 * t + e] = elem(v.a[0], e);
      A[g + 8][2 * t + e] = elem(v.a[1], e);
      A[g][2 * t + 8 + e] = elem(v.a[2], e);
      A[g + 8][2 * t + 8 + e] = elem(v.a[3], e);
      B[2 * t + e][g] = elem(v.b[0], e);
      B[2 * t + 8 + e][g] = elem(v.b[1], e);
    }
    C[g][2 * t] = v.c[0];
    C[g][2 * t + 1] = v.c[1];
    C[g + 8][2 * t] = v.c[2];
    C[g + 8][2 * t + 1] = v.c[3];
  }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      float acc = C[i][j];
      for (int k = 0; k < 16; ++k) acc += A[i][k] * B[k][j];
      C[i][j] = acc;
    }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const float d[4] = {C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1]};
    memcpy(out[lane], d, sizeof d);
  }
  ++g_mma_count;
}

void ldsm_compute(const Payload* in, Payload* out, int arg) {
  const int num = arg >> 1;
  const bool trans = (arg & 1) != 0;
  uint16_t M[4][8][8];  // [matrix][row][col]
  for (int m = 0; m < num; ++m)
    for (int r = 0; r < 8; ++r) {
      const void* row;
      memcpy(&row, in[8 * m + r], sizeof row);
      memcpy(M[m][r], row, 16);  // checked when the lane deposited it
    }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    uint32_t regs[4] = {0, 0, 0, 0};
    for (int m = 0; m < num; ++m) {
      const uint16_t lo = trans ? M[m][2 * t][g] : M[m][g][2 * t];
      const uint16_t hi = trans ? M[m][2 * t + 1][g] : M[m][g][2 * t + 1];
      regs[m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    memcpy(out[lane], regs, sizeof regs);
  }
}
}  // namespace

void ldmatrix(int num, bool trans, uint32_t* r, const void* row, unsigned site) {
  if (num != 1 && num != 2 && num != 4) fail("ldmatrix .x" + std::to_string(num) + " at " + where());
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (lane < 8 * num) {  // the lanes whose addresses the instruction reads
    check_shared(row, 16, "ldmatrix row");
    shared_access(row, site);
  }
  uint32_t regs[4];
  warp_collective(kKindLdsm + (num << 1 | (trans ? 1 : 0)), site, &row, sizeof row, regs, sizeof regs,
                  ldsm_compute, num << 1 | (trans ? 1 : 0));
  memcpy(r, regs, sizeof(uint32_t) * static_cast<size_t>(num));
}

void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, unsigned site) {
  MmaIn v{{a[0], a[1], a[2], a[3]}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
  warp_collective(bf16 ? kKindMmaBf16 : kKindMmaF16, site, &v, sizeof v, d, sizeof d, mma_compute, bf16 ? 1 : 0);
}

long mma_count() { return g_mma_count; }

void set_order(Order o) { g_order = o; }
const char* order_name() {
  static const char* const names[] = {"fwd", "rev", "shuffle"};
  return names[order_mode()];
}

void register_shared(void* p, size_t n) {
  for (auto& r : g_shared)
    if (r.first == p) return;
  g_shared.emplace_back(p, n);
  memset(p, 0xff, n);
}

void fail(const std::string& msg) {
  fprintf(stderr, "SIM FAILURE: %s\n", msg.c_str());
  fflush(stderr);
  abort();
}

void check_range(const void* p, size_t n, const char* what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocs.upper_bound(a);
  if (it != g_allocs.begin()) {
    --it;
    if (a >= it->first && a + n <= it->first + it->second.n) {
      if ((n & (n - 1)) == 0 && a % n != 0) fail(std::string(what) + " misaligned at " + where());
      return;
    }
  }
  char b[64];
  snprintf(b, sizeof b, "%p", p);
  fail(std::string(what) + " out of every allocation: " + b + " at " + where());
}

// ---------------------------------------------------------------- bank conflicts
// Shared memory has 32 banks of 4 bytes; a warp's 16-byte accesses are served in four phases of 8
// lanes, and a phase conflicts when two of its lanes touch different 16-byte chunks that fall in
// the same group of 4 banks ((address / 16) % 8). Lanes reading the same chunk are one broadcast.
// Threads run one at a time here, so a warp instruction is reconstructed as: the accesses its lanes
// made at the same source line, the n-th of each lane's accesses there being instruction n. That is
// only sound when every lane that reached the line did so equally often (the lanes ran converged);
// lines where they did not (e.g. lanes idling for head sizes that are not powers of two) are not
// judged. Checked whenever a block barrier completes and when a block ends.
namespace {
bool banks_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("DECODEGRAPH_SIM_BANKS");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

void check_banks() {
  if (!banks_enabled()) return;
  for (int w0 = 0; w0 < nthreads; w0 += 32) {
    std::map<unsigned, std::map<int, unsigned>> count;  // site -> lane -> accesses
    for (int t = w0; t < w0 + 32 && t < nthreads; ++t)
      for (const auto& [site, n] : fibers[t].by_site) count[site][t - w0] = n;
    for (const auto& [site, lanes] : count) {
      const unsigned n = lanes.begin()->second;
      bool converged = true;
      for (const auto& [lane, c] : lanes) converged = converged && c == n;
      if (!converged) continue;
      // addr[occurrence][lane]
      std::vector<std::vector<uintptr_t>> addr(n, std::vector<uintptr_t>(32, 0));
      std::vector<bool> active(32, false);
      for (const auto& [lane, c] : lanes) active[lane] = true;
      for (int t = w0; t < w0 + 32 && t < nthreads; ++t)
        for (const Access& a : fibers[t].accesses)
          if (a.site == site) addr[a.occurrence][t - w0] = a.addr;
      for (unsigned o = 0; o < n; ++o)
        for (int p0 = 0; p0 < 32; p0 += 8) {
          uintptr_t chunk_of_group[8];
          int used[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int l = p0; l < p0 + 8; ++l) {
            if (!active[l]) continue;
            const uintptr_t chunk = addr[o][l] / 16;
            const int g = static_cast<int>(chunk % 8);
            if (used[g] && chunk_of_group[g] != chunk) {
              char b[200];
              snprintf(b, sizeof b,
                       "shared-memory bank conflict at line %u (access %u): lanes of warp %d read/write "
                       "different 16-byte chunks in one bank group in block (%u,%u,%u)",
                       site, o, w0 / 32, blockIdx.x, blockIdx.y, blockIdx.z);
              fail(b);
            }
            used[g] = 1;
            chunk_of_group[g] = chunk;
          }
        }
    }
  }
  for (int t = 0; t < nthreads; ++t) {
    fibers[t].accesses.clear();
    fibers[t].by_site.clear();
  }
}
}  // namespace

void shared_access(const void* p, unsigned site) {
  if (!banks_enabled()) return;
  unsigned occurrence = 0;
  bool found = false;
  for (auto& [s, n] : cur->by_site)
    if (s == site) {
      occurrence = n++;
      found = true;
      break;
    }
  if (!found) cur->by_site.emplace_back(site, 1u);
  cur->accesses.push_back(Access{site, occurrence, reinterpret_cast<uintptr_t>(p)});
}

void syncthreads() {
  const long g = bar_gen;
  ++bar_arrived;
  ++progress;
  if (bar_arrived == nthreads) {
    check_banks();  // everyone's accesses before this barrier are recorded
    bar_arrived = 0;
    ++bar_gen;
    ++barriers_done;
    return;
  }
  while (bar_gen == g) yield();
}
void syncwarp(unsigned mask) { warp_op(2, mask, 0.0f, 0); }
float shfl_xor(unsigned mask, float v, int off) { return warp_op(1, mask, v, off); }
float shfl_idx(unsigned mask, float v, int src_lane, int width) { return warp_op(3, mask, v, src_lane, width); }

void check_shared(const void* p, size_t n, const char* what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  static size_t last = 0;  // the array of the previous check: nearly always the same one
  for (size_t k = 0; k < g_shared.size(); ++k) {
    const size_t i = (last + k) % g_shared.size();
    const uintptr_t b = reinterpret_cast<uintptr_t>(g_shared[i].first);
    if (a >= b && a + n <= b + g_shared[i].second) {
      if (a % n != 0) fail(std::string(what) + " misaligned shared address at " + where());
      last = i;
      return;
    }
  }
  fail(std::string(what) + " outside every __shared__ array at " + where());
}

void cp_async(void* dst, const void* src, int src_bytes) {
  if (src_bytes < 0 || src_bytes > 16) fail("cp.async with src-size " + std::to_string(src_bytes) + " at " + where());
  check_shared(dst, 16, "cp.async destination");
  if (src_bytes > 0) {
    if (reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async source misaligned at " + where());
    check_range(src, static_cast<size_t>(src_bytes), "cp.async source");
  }
  memset(dst, 0xff, 16);  // NaN until the group is waited for
  cur->copies.push_back(Copy{dst, src, src_bytes, cur->committed});
}

void cp_async_commit() { ++cur->committed; }

void cp_async_wait(int n) {
  // Groups with index < committed - n have landed; the open (uncommitted) group is never waited.
  const long done_below = cur->committed - n;
  auto& cs = cur->copies;
  size_t keep = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    if (cs[i].group < done_below) {
      if (cs[i].bytes > 0) memcpy(cs[i].dst, cs[i].src, static_cast<size_t>(cs[i].bytes));
      memset(static_cast<char*>(cs[i].dst) + cs[i].bytes, 0, static_cast<size_t>(16 - cs[i].bytes));
    } else {
      cs[keep++] = cs[i];
    }
  }
  cs.resize(keep);
}

void launch(const std::function<void()>& fn, dim3 grid, dim3 block, size_t smem) {
  if (block.y != 1 || block.z != 1 || smem != 0) fail("simulator handles 1-D blocks without dynamic smem");
  nthreads = static_cast<int>(block.x);
  if (nthreads <= 0 || nthreads > 1024) fail("bad block size");
  gridDim = grid;
  blockDim = block;
  body = &fn;
  if (static_cast<int>(fibers.size()) < nthreads) {
    const size_t old = fibers.size();
    fibers.resize(nthreads);
    for (size_t i = 0; i < fibers.size(); ++i)
      if (i >= old || fibers[i].stack == nullptr) fibers[i].stack = static_cast<char*>(malloc(kStack));
  }
  warps.assign((nthreads + 31) / 32, Warp{});
  std::vector<uint3> blocks;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back(uint3{x, y, z});
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const int mode = order_mode();
  std::vector<int> order(nthreads);
  std::iota(order.begin(), order.end(), 0);
  if (mode == 1) std::reverse(order.begin(), order.end());
  for (const uint3& b : blocks) {
    blockIdx = b;
    for (auto& r : g_shared) memset(r.first, 0xff, r.second);
    bar_arrived = 0;
    for (Warp& w : warps) w.arrived = 0;
    for (int t = 0; t < nthreads; ++t) {
      Fiber& f = fibers[t];
      f.started = false;
      f.done = false;
      f.tid = t;
      f.copies.clear();
      f.committed = 0;
      f.accesses.clear();
      f.by_site.clear();
      getcontext(&f.uc);
      f.uc.uc_stack.ss_sp = f.stack;
      f.uc.uc_stack.ss_size = kStack;
      f.uc.uc_link = nullptr;
      makecontext(&f.uc, trampoline, 0);
    }
    int done = 0;
    while (done < nthreads) {
      if (mode == 2) std::shuffle(order.begin(), order.end(), rng);
      const long before = progress;
      done = 0;
      for (int t : order) {
        Fiber& f = fibers[t];
        if (f.done) { ++done; continue; }
        cur = &f;
        threadIdx = uint3{static_cast<unsigned>(t), 0, 0};
        if (!_setjmp(sched_jb)) {
          if (!f.started) {
            f.started = true;
            setcontext(&f.uc);
          } else {
            _longjmp(f.jb, 1);
          }
        }
        if (f.done) ++done;
      }
      if (done < nthreads && progress == before) {
        int exited = 0;
        for (int t = 0; t < nthreads; ++t) exited += fibers[t].done;
        char buf[200];
        snprintf(buf, sizeof buf, "deadlock in block (%u,%u,%u): %d of %d threads exited, %d at the block barrier",
                 b.x, b.y, b.z, exited, nthreads, bar_arrived);
        fail(buf);
      }
    }
    if (bar_arrived != 0) fail("block ended with threads at a barrier");
    check_banks();
  }
}
}  // namespace sim
