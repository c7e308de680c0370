#include "sim_runtime.hpp"

#include "decodegraph/numeric.hpp"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#if defined(DECODEGRAPH_SIM_ALIGNMENT_CHECK)
#include <sanitizer/common_interface_defs.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

#if defined(DECODEGRAPH_SIM_ALIGNMENT_CHECK)
// The kernels are compiled with -fsanitize=alignment (CMakeLists.txt): its report (above this
// line) names the misaligned load or store; a GPU would fault there.
namespace {
const bool g_alignment_hook = [] {
  __sanitizer_set_death_callback([] {
    fprintf(stderr, "SIM FAILURE: misaligned access (the runtime error above); a GPU faults on it\n");
    fflush(stderr);
    abort();
  });
  return true;
}();
}  // namespace
#endif


const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorSim"; }
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() {
  sim::flush();
  return cudaSuccess;
}

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
  sim::flush();  // a deferred launch may still use it
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end()) return cudaSuccess;
  munmap(it->second.base, it->second.map_bytes);
  g_allocs.erase(it);
  return cudaSuccess;
}
// A copy or a fill is stream-ordered after every launch before it, and is no kernel: a programmatic
// launch after it is fully ordered (CUDA serializes it), so the deferred launch runs first.
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  sim::flush();
  memcpy(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* d, int v, size_t n) {
  sim::flush();
  memset(d, v, n);
  return cudaSuccess;
}

namespace sim {
namespace {
// ---------------------------------------------------------------- cp.async visibility (state)
// PTX ISA, "cp.async.wait_group": the copies' writes become visible to the executing thread only;
// another thread may read them after a barrier that follows the wait (or, in the writer's warp, a
// __syncwarp). Each 16-byte chunk of a __shared__ array has a state: a copy in flight, or data
// landed since the last barrier and visible to its writer (or the writer's warp) only. Tracked
// reads (lds16, ldmatrix rows) of bytes they may not see fail with a message; plain C++ reads see
// NaN bytes, because such a chunk holds its data only while a thread that may see it runs (the
// scheduler shows and hides it at every switch). Tracked reads are also recorded, so a cp.async
// into bytes another thread read since the last barrier (a stage refilled too early) fails.
enum class Vis : uint8_t { kNone, kInFlight, kThread, kWarp };
struct ChunkState {
  Vis vis = Vis::kNone;
  int writer = -1;          // the issuing thread while vis != kNone
  uint32_t ticket = 0;      // identifies the Landed entry while it is live
  int reader = -1;          // the thread of the tracked reads in barrier epoch read_epoch; -2: several
  int reader_warp = -1;     // their warp; -2: several
  long read_epoch = -1;
  long reader_syncs = 0;    // the readers' warp's __syncwarp count at the last read
};
struct Region {
  unsigned char* base;
  size_t n;
  uintptr_t chunk0;  // base rounded down to 16 bytes
  std::vector<ChunkState> chunks;
};
// A chunk landed since the last barrier; data holds its bytes while they are hidden.
struct Landed {
  unsigned char* addr;
  ChunkState* st;
  uint32_t ticket;
  unsigned char data[16];
};
struct Copy {
  void* dst;
  const void* src;
  int bytes;
  long group;
  ChunkState* st;
  const void* src_hi = nullptr;  // cp_async_halves: bytes 8-15 from here (src, bytes: the low half)
  int bytes_hi = -1;             // -1: one 16-byte copy
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
  std::vector<Landed> landed;  // chunks it landed since the last barrier, visible to it alone
  const long* park = nullptr;  // the generation it waits on to move past park_gen (wait_past)
  long park_gen = 0;
};
constexpr size_t kStack = 256 * 1024;
std::vector<Fiber> fibers;
std::vector<Region> g_shared;
uint32_t g_ticket = 0;
jmp_buf sched_jb;
Fiber* cur = nullptr;
const std::function<void()>* body = nullptr;
int nthreads = 0;
long progress = 0;
int bar_arrived = 0;
int exited = 0;  // threads of this block that returned: a barrier no longer waits for them
long bar_gen = 0;
long barriers_done = 0;
const char* bar_file = nullptr;  // call site of the barrier the arrived threads wait at
unsigned bar_line = 0;
struct Warp {
  int arrived = 0;
  long gen = 0;
  int kind = 0;
  unsigned site = 0;  // call site of a payload collective (0 for the shuffles and syncwarp)
  float vals[32], snap[32];
  unsigned char in[32][64], out[32][64];  // payload collectives (ldmatrix, mma)
  long syncs = 0;               // __syncwarp completed in this block
  std::vector<Landed> landed;   // chunks its lanes landed before a __syncwarp, since the last barrier
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
// Waits until a rendezvous' generation moves on. The scheduler does not switch to a thread parked
// here until it has: the thread would only look and yield again.
void wait_past(const long& gen, long g) {
  cur->park = &gen;
  cur->park_gen = g;
  while (gen == g) yield();
  cur->park = nullptr;
}

// ---------------------------------------------------------------- programmatic dependent launch
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the
// kernel before it in the stream still runs (PTX ISA, "griddepcontrol": .wait blocks the thread
// until the prerequisite grids have completed and their memory operations are visible). The model
// shows a dependent the predecessor's memory as the worst legal schedule does:
//  - Every stream launch is deferred (enqueue) until the next launch or runtime call. When the next
//    one is programmatic, the deferred predecessor runs first, its global writes found by comparing
//    every allocation before and after it (bytes it wrote with the value they held are unseen).
//  - Then, in every block of the dependent, those bytes hold 0xff (NaN for floats, -1 for ints) and
//    every allocation is read-only until the predecessor "completes": when a thread is parked at
//    griddepcontrol.wait and no other thread of the block can move (all parked or exited), the
//    bytes come back and the waiting threads go on. So all the code a block can run before its wait
//    runs against unwritten data: a read hoisted above the wait reads poison, a store faults.
//  - A block that ends with no thread past the wait fails: its grid could then complete before its
//    predecessor, and a programmatic successor's wait would no longer order it after that one.
// After a non-kernel operation (cudaMemcpy, cudaMemset) a programmatic launch is fully ordered, as
// CUDA orders it, and its wait returns at once. launch_dependents only counts: it is a scheduling
// hint that never changes what memory a wait sees.
struct Range {
  unsigned char* p;
  size_t n;
};
struct Deferred {
  std::function<void()> fn;
  dim3 grid, block;
  size_t smem = 0;
  bool modelled = false;       // programmatic, after a kernel: run the model
  std::vector<Range> written;  // what the predecessor wrote
};
std::optional<Deferred> g_deferred;
const std::vector<Range>* g_pdl_written = nullptr;  // non-null while a modelled launch runs
std::vector<unsigned char> g_pdl_saved;
bool g_pdl_before = false;     // the running block's predecessor has not completed
bool g_pdl_protected = false;  // allocations read-only
long g_pdl_gen = 0;            // moves when the predecessor completes for the running block
PdlCounts g_pdl_counts;

bool in_allocation(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [user, al] : g_allocs)
    if (a >= reinterpret_cast<uintptr_t>(al.base) + 4096 && a < reinterpret_cast<uintptr_t>(al.base) + al.map_bytes - 4096)
      return true;
  return false;
}
void pdl_segv(int, siginfo_t* si, void*) {
  if (g_pdl_protected && in_allocation(si->si_addr)) {
    fprintf(stderr,
            "SIM FAILURE: a store to global memory (%p) before griddepcontrol.wait at %s: the predecessor "
            "grid may still read or write it\n",
            si->si_addr, where().c_str());
    fflush(stderr);
    abort();
  }
  signal(SIGSEGV, SIG_DFL);  // not the model's: the access faults again, with the default action
}
void protect_allocations(bool read_only) {
  if (read_only) {
    static const bool installed = [] {
      struct sigaction sa {};
      sa.sa_sigaction = pdl_segv;
      sa.sa_flags = SA_SIGINFO;
      sigemptyset(&sa.sa_mask);
      return sigaction(SIGSEGV, &sa, nullptr) == 0;
    }();
    if (!installed) fail("PDL model: cannot install the SIGSEGV handler");
  }
  for (const auto& [user, al] : g_allocs)
    if (mprotect(al.base + 4096, al.map_bytes - 2 * 4096, read_only ? PROT_READ : PROT_READ | PROT_WRITE) != 0)
      fail("PDL model: mprotect failed");
  g_pdl_protected = read_only;
}
// A block of a modelled launch starts: the predecessor still runs.
void pdl_block_begin() {
  size_t total = 0;
  for (const Range& r : *g_pdl_written) total += r.n;
  g_pdl_saved.resize(total);
  size_t off = 0;
  for (const Range& r : *g_pdl_written) {
    memcpy(g_pdl_saved.data() + off, r.p, r.n);  // the predecessor's bytes, and earlier blocks' stores
    memset(r.p, 0xff, r.n);
    off += r.n;
  }
  protect_allocations(true);
  g_pdl_before = true;
}
// The predecessor completes (for the running block).
void pdl_release() {
  protect_allocations(false);
  size_t off = 0;
  for (const Range& r : *g_pdl_written) {
    memcpy(r.p, g_pdl_saved.data() + off, r.n);
    off += r.n;
  }
  g_pdl_before = false;
  ++g_pdl_gen;
}
// Every allocation's bytes, to find what a kernel writes.
struct Snapshot {
  std::vector<std::pair<Alloc, std::vector<unsigned char>>> allocs;
  unsigned char* user(const Alloc& a) const { return reinterpret_cast<unsigned char*>(a.base) + a.map_bytes - 4096 - a.n; }
};
Snapshot snapshot() {
  size_t total = 0;
  for (const auto& [user, al] : g_allocs) total += al.n;
  if (total > (size_t{1} << 31))
    fail("PDL model: more than 2 GiB allocated; a programmatic launch needs a copy of every allocation");
  Snapshot s;
  for (const auto& [user, al] : g_allocs) {
    const auto* u = reinterpret_cast<const unsigned char*>(user);
    s.allocs.emplace_back(al, std::vector<unsigned char>(u, u + al.n));
  }
  return s;
}
// The 4-byte words (allocations are 16-byte aligned and sized) whose bytes changed: a store of an
// element whose low byte held that value already is still poisoned whole. A word the kernel
// rewrote with the value it held is not found (no output of such a write can differ either).
std::vector<Range> written_since(const Snapshot& s) {
  std::vector<Range> out;
  for (const auto& [al, before] : s.allocs) {
    unsigned char* u = s.user(al);
    for (size_t i = 0; i < al.n;) {
      const size_t block = std::min<size_t>(64, al.n - i);
      if (memcmp(u + i, before.data() + i, block) == 0) {
        i += block;
        continue;
      }
      for (const size_t e = i + block; i < e; i += 4) {
        if (memcmp(u + i, before.data() + i, 4) == 0) continue;
        if (!out.empty() && out.back().p + out.back().n == u + i)
          out.back().n += 4;
        else
          out.push_back(Range{u + i, 4});
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------- cp.async visibility
// Invariant: a live Landed chunk holds its data in shared memory exactly while a thread that may
// see it runs (its writer, or a lane of its writer's warp once it is in the warp's list); the
// scheduler calls show() before it switches to a thread and hide() after.
bool live(const Landed& e) { return e.st->ticket == e.ticket; }
// Bytes a cp.async poisoned (in flight, or landed and hidden) change only by a plain store of a
// thread that is not ordered after the copy: a race.
bool poisoned(const void* p) {
  static const unsigned char kPoison[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  return memcmp(p, kPoison, 16) == 0;
}
void hide(std::vector<Landed>& v) {
  for (Landed& e : v)
    if (live(e)) {
      memcpy(e.data, e.addr, 16);  // what its writer left there, its own later stores included
      memset(e.addr, 0xff, 16);
    }
}
void show(std::vector<Landed>& v) {
  for (Landed& e : v)
    if (live(e)) {
      if (!poisoned(e.addr))
        fail("a plain store into shared bytes that thread " + std::to_string(e.st->writer) +
             "'s cp.async landed, by a thread with no barrier since its cp.async.wait_group (block " +
             std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," + std::to_string(blockIdx.z) + ")");
      memcpy(e.addr, e.data, 16);
    }
}
// Thread t starts or stops running.
void enter(int t) {
  show(fibers[t].landed);
  show(warps[t / 32].landed);
}
void leave(int t) {
  hide(fibers[t].landed);
  hide(warps[t / 32].landed);
}
// A block barrier completed (the running thread arrived last, or exited): every landed chunk is
// visible to every thread.
void publish_to_block() {
  const int me = cur->tid;
  auto settle = [](std::vector<Landed>& v, bool hidden) {
    if (hidden) show(v);
    for (Landed& e : v)
      if (live(e)) *e.st = ChunkState{};
    v.clear();
  };
  for (int t = 0; t < nthreads; ++t) settle(fibers[t].landed, t != me);
  for (size_t w = 0; w < warps.size(); ++w) settle(warps[w].landed, static_cast<int>(w) != me / 32);
}
// A __syncwarp of warp w completed (the running lane arrived last): what its lanes landed becomes
// visible to the warp.
void publish_to_warp(int w) {
  const int me = cur->tid;
  Warp& wp = warps[w];
  for (int t = w * 32; t < w * 32 + 32 && t < nthreads; ++t) {
    if (t != me) show(fibers[t].landed);
    for (Landed& e : fibers[t].landed)
      if (live(e)) {
        e.st->vis = Vis::kWarp;
        wp.landed.push_back(e);
      }
    fibers[t].landed.clear();
  }
  ++wp.syncs;
}
void check_banks();
void complete_barrier() {
  check_banks();  // everyone's accesses before this barrier are recorded
  publish_to_block();
  bar_arrived = 0;
  ++bar_gen;
  ++barriers_done;
}

void trampoline() {
  (*body)();
  if (!cur->copies.empty())
    fail("thread exited with " + std::to_string(cur->copies.size()) +
         " cp.async copies it never waited for (missing cp.async.wait_group) at " + where());
  cur->done = true;
  ++exited;
  ++progress;
  // PTX: a barrier waits for the threads that have not exited; this exit may complete one.
  if (bar_arrived > 0 && bar_arrived == nthreads - exited) complete_barrier();
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
    if (kind == 2) publish_to_warp(tid / 32);
    w.arrived = 0;
    ++w.gen;
  } else {
    wait_past(w.gen, g);
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
    wait_past(w.gen, g);
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
    for (int r = 0; r < 8; ++r) memcpy(M[m][r], in[8 * m + r], 16);  // read by the addressing lane
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
  // The lanes whose addresses the instruction reads deposit their row, read as they see it (the
  // cp.async visibility model treats the addressing lane as the row's reader).
  unsigned char bytes[16] = {};
  if (lane < 8 * num) {
    shared_load16(row, "ldmatrix row");
    shared_access(row, site);
    memcpy(bytes, row, 16);
  }
  uint32_t regs[4];
  warp_collective(kKindLdsm + (num << 1 | (trans ? 1 : 0)), site, bytes, sizeof bytes, regs, sizeof regs,
                  ldsm_compute, num << 1 | (trans ? 1 : 0));
  memcpy(r, regs, sizeof(uint32_t) * static_cast<size_t>(num));
}

void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, unsigned site) {
  MmaIn v{{a[0], a[1], a[2], a[3]}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
  warp_collective(bf16 ? kKindMmaBf16 : kKindMmaF16, site, &v, sizeof v, d, sizeof d, mma_compute, bf16 ? 1 : 0);
}

long mma_count() {
  flush();
  return g_mma_count;
}

void set_order(Order o) { g_order = o; }
const char* order_name() {
  static const char* const names[] = {"fwd", "rev", "shuffle"};
  return names[order_mode()];
}

void register_shared(void* p, size_t n) {
  for (auto& r : g_shared)
    if (r.base == p) return;
  unsigned char* b = static_cast<unsigned char*>(p);
  const uintptr_t c0 = reinterpret_cast<uintptr_t>(b) / 16 * 16;
  g_shared.push_back(Region{b, n, c0, std::vector<ChunkState>((reinterpret_cast<uintptr_t>(b) + n - c0 + 15) / 16)});
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

// PTX ISA, "barrier": __syncthreads is bar.sync 0, i.e. barrier.sync.aligned: all threads of the
// block execute the same barrier instruction (here: the same call site), and it waits for the
// threads that have not exited.
void syncthreads(const char* file, unsigned line) {
  if (bar_arrived == 0) {
    bar_file = file;
    bar_line = line;
  } else if (line != bar_line || (file != bar_file && strcmp(file, bar_file) != 0)) {
    fail("threads of one block at different __syncthreads: " + std::string(file) + ":" + std::to_string(line) +
         " while " + std::to_string(bar_arrived) + " wait at " + bar_file + ":" + std::to_string(bar_line) +
         " (PTX: every thread must reach the same barrier instruction) at " + where());
  }
  const long g = bar_gen;
  ++bar_arrived;
  ++progress;
  if (bar_arrived == nthreads - exited) {
    complete_barrier();
    return;
  }
  wait_past(bar_gen, g);
}
long barrier_epoch() { return barriers_done; }
void syncwarp(unsigned mask) { warp_op(2, mask, 0.0f, 0); }
float shfl_xor(unsigned mask, float v, int off) { return warp_op(1, mask, v, off); }
float shfl_idx(unsigned mask, float v, int src_lane, int width) { return warp_op(3, mask, v, src_lane, width); }

namespace {
Region& find_shared(const void* p, size_t n, const char* what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  static size_t last = 0;  // the array of the previous check: nearly always the same one
  for (size_t k = 0; k < g_shared.size(); ++k) {
    const size_t i = (last + k) % g_shared.size();
    const uintptr_t b = reinterpret_cast<uintptr_t>(g_shared[i].base);
    if (a >= b && a + n <= b + g_shared[i].n) {
      if (a % n != 0) fail(std::string(what) + " misaligned shared address at " + where());
      last = i;
      return g_shared[i];
    }
  }
  fail(std::string(what) + " outside every __shared__ array at " + where());
  abort();
}
// The state of the 16-byte chunk at p (16-byte aligned, inside r).
ChunkState& chunk_at(Region& r, const void* p) { return r.chunks[(reinterpret_cast<uintptr_t>(p) - r.chunk0) / 16]; }
std::string thread_name(int t) { return "thread " + std::to_string(t); }
}  // namespace

void check_shared(const void* p, size_t n, const char* what) { find_shared(p, n, what); }

void shared_load16(const void* p, const char* what) {
  ChunkState& st = chunk_at(find_shared(p, 16, what), p);
  const int me = cur->tid;
  switch (st.vis) {
    case Vis::kNone: break;
    case Vis::kInFlight:
      fail(std::string(what) + " reads shared bytes whose cp.async (issued by " + thread_name(st.writer) +
           ") has not landed: no cp.async.wait_group covers it yet, at " + where());
      break;
    case Vis::kThread:
      if (st.writer != me)
        fail(std::string(what) + " reads shared bytes that " + thread_name(st.writer) +
             "'s cp.async landed with no barrier since its cp.async.wait_group (PTX: the wait makes the data "
             "visible to the issuing thread; the others need a barrier after it), at " + where());
      break;
    case Vis::kWarp:
      if (st.writer / 32 != me / 32)
        fail(std::string(what) + " reads shared bytes that " + thread_name(st.writer) +
             "'s cp.async landed with only a __syncwarp of its own warp since, at " + where());
      break;
  }
  if (st.read_epoch != barriers_done) {
    st.read_epoch = barriers_done;
    st.reader = me;
    st.reader_warp = me / 32;
  } else {
    if (st.reader != me) st.reader = -2;
    if (st.reader_warp != me / 32) st.reader_warp = -2;
  }
  st.reader_syncs = warps[me / 32].syncs;
}

namespace {
// Issues one copy into the 16-byte chunk at dst (sources checked by the callers).
void issue_chunk_copy(Copy c);
}  // namespace

void cp_async(void* dst, const void* src, int src_bytes) {
  if (src_bytes < 0 || src_bytes > 16) fail("cp.async with src-size " + std::to_string(src_bytes) + " at " + where());
  if (src_bytes > 0) {
    if (reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async source misaligned at " + where());
    check_range(src, static_cast<size_t>(src_bytes), "cp.async source");
  }
  issue_chunk_copy(Copy{dst, src, src_bytes, 0, nullptr});
}

void cp_async_halves(void* dst, const void* src_lo, int n_lo, const void* src_hi, int n_hi) {
  for (auto [src, n] : {std::pair{src_lo, n_lo}, std::pair{src_hi, n_hi}}) {
    if (n < 0 || n > 8) fail("cp.async (8 bytes) with src-size " + std::to_string(n) + " at " + where());
    if (n > 0) {
      if (reinterpret_cast<uintptr_t>(src) % 8 != 0) fail("cp.async (8 bytes) source misaligned at " + where());
      check_range(src, static_cast<size_t>(n), "cp.async source");
    }
  }
  issue_chunk_copy(Copy{dst, src_lo, n_lo, 0, nullptr, src_hi, n_hi});
}

namespace {
void issue_chunk_copy(Copy c) {
  void* dst = c.dst;
  ChunkState& st = chunk_at(find_shared(dst, 16, "cp.async destination"), dst);
  const int me = cur->tid;
  // Write after write: another copy into these bytes in flight (PTX: no order between two cp.async
  // without a wait), or landed by a thread this one is not ordered after.
  if (st.vis == Vis::kInFlight)
    fail("cp.async into shared bytes that a cp.async of " + thread_name(st.writer) +
         " still writes (no cp.async.wait_group between them) at " + where());
  if ((st.vis == Vis::kThread && st.writer != me) || (st.vis == Vis::kWarp && st.writer / 32 != me / 32))
    fail("cp.async into shared bytes that " + thread_name(st.writer) +
         "'s cp.async landed with no barrier in between at " + where());
  // Write after read: another thread read these bytes since the last barrier (a stage refilled
  // while it is still being read), unless they are all of this warp and a __syncwarp followed.
  if (st.read_epoch == barriers_done && st.reader != me &&
      !(st.reader_warp == me / 32 && warps[me / 32].syncs > st.reader_syncs))
    fail("cp.async overwrites shared bytes that " +
         (st.reader >= 0 ? thread_name(st.reader) : std::string("other threads")) +
         " read with no barrier in between at " + where());
  st = ChunkState{Vis::kInFlight, me, 0, st.reader, st.reader_warp, st.read_epoch, st.reader_syncs};
  memset(dst, 0xff, 16);  // NaN until the group is waited for
  c.group = cur->committed;
  c.st = &st;
  cur->copies.push_back(c);
}
}  // namespace

void cp_async_commit() { ++cur->committed; }

void cp_async_wait(int n) {
  // Groups with index < committed - n have landed; the open (uncommitted) group is never waited.
  const long done_below = cur->committed - n;
  auto& cs = cur->copies;
  size_t keep = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    if (cs[i].group < done_below) {
      if (!poisoned(cs[i].dst))
        fail("a plain store into shared bytes while a cp.async (issued by " + where() +
             ") wrote them: it lands over the store");
      char* d = static_cast<char*>(cs[i].dst);
      if (cs[i].bytes_hi < 0) {
        if (cs[i].bytes > 0) memcpy(d, cs[i].src, static_cast<size_t>(cs[i].bytes));
        memset(d + cs[i].bytes, 0, static_cast<size_t>(16 - cs[i].bytes));
      } else {  // two 8-byte halves
        if (cs[i].bytes > 0) memcpy(d, cs[i].src, static_cast<size_t>(cs[i].bytes));
        memset(d + cs[i].bytes, 0, static_cast<size_t>(8 - cs[i].bytes));
        if (cs[i].bytes_hi > 0) memcpy(d + 8, cs[i].src_hi, static_cast<size_t>(cs[i].bytes_hi));
        memset(d + 8 + cs[i].bytes_hi, 0, static_cast<size_t>(8 - cs[i].bytes_hi));
      }
      // Landed: visible to this thread alone until the next barrier.
      ChunkState& st = *cs[i].st;
      st.vis = Vis::kThread;
      st.ticket = ++g_ticket;
      cur->landed.push_back(Landed{static_cast<unsigned char*>(cs[i].dst), &st, st.ticket, {}});
    } else {
      cs[keep++] = cs[i];
    }
  }
  cs.resize(keep);
}

namespace {
void run_now(const std::function<void()>& fn, dim3 grid, dim3 block, size_t smem, const std::vector<Range>* written);
}  // namespace

void launch(const std::function<void()>& fn, dim3 grid, dim3 block, size_t smem) {
  flush();
  run_now(fn, grid, block, smem, nullptr);
}

void enqueue(std::function<void()> fn, dim3 grid, dim3 block, size_t smem, bool programmatic) {
  Deferred next{std::move(fn), grid, block, smem, false, {}};
  if (g_deferred && programmatic) {  // after a kernel: the model (see "programmatic dependent launch")
    const Snapshot before = snapshot();
    flush();
    next.modelled = true;
    next.written = written_since(before);
  } else {
    flush();
  }
  g_deferred = std::move(next);
}

void flush() {
  if (!g_deferred) return;
  Deferred d = std::move(*g_deferred);
  g_deferred.reset();
  if (d.modelled) ++g_pdl_counts.modelled_launches;
  run_now(d.fn, d.grid, d.block, d.smem, d.modelled ? &d.written : nullptr);
}

void grid_dependency_wait() {
  if (g_pdl_written == nullptr || !g_pdl_before) return;  // not modelled, or the predecessor is done
  ++g_pdl_counts.held_waits;
  ++progress;
  wait_past(g_pdl_gen, g_pdl_gen);
}

void launch_dependents() { ++g_pdl_counts.triggers; }

PdlCounts pdl_counts() {
  flush();
  return g_pdl_counts;
}

namespace {
void run_now(const std::function<void()>& fn, dim3 grid, dim3 block, size_t smem, const std::vector<Range>* written) {
  g_pdl_written = written;
  struct Clear {
    ~Clear() { g_pdl_written = nullptr; }
  } clear;
  if (block.y != 1 || block.z != 1 || smem != 0) fail("simulator handles 1-D blocks without dynamic smem");
  nthreads = static_cast<int>(block.x);
  if (nthreads <= 0 || nthreads > 1024) fail("bad block size");
  // The hardware's grid limits (CUDA C Programming Guide, "Compute Capabilities"): a launch past
  // them fails with cudaErrorInvalidConfiguration on the GPU.
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    fail("grid dimensions past the hardware's limits (x <= 2^31 - 1, y and z <= 65535, none 0)");
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
    for (auto& r : g_shared) {
      memset(r.base, 0xff, r.n);
      std::fill(r.chunks.begin(), r.chunks.end(), ChunkState{});
    }
    bar_arrived = 0;
    exited = 0;
    for (Warp& w : warps) {
      w.arrived = 0;
      w.syncs = 0;
      w.landed.clear();
    }
    for (int t = 0; t < nthreads; ++t) {
      Fiber& f = fibers[t];
      f.started = false;
      f.done = false;
      f.tid = t;
      f.copies.clear();
      f.committed = 0;
      f.accesses.clear();
      f.by_site.clear();
      f.landed.clear();
      f.park = nullptr;
      getcontext(&f.uc);
      f.uc.uc_stack.ss_sp = f.stack;
      f.uc.uc_stack.ss_size = kStack;
      f.uc.uc_link = nullptr;
      makecontext(&f.uc, trampoline, 0);
    }
    if (written) pdl_block_begin();
    int done = 0;
    while (done < nthreads) {
      if (mode == 2) std::shuffle(order.begin(), order.end(), rng);
      const long before = progress;
      done = 0;
      for (int t : order) {
        Fiber& f = fibers[t];
        if (f.done) { ++done; continue; }
        if (f.park != nullptr && *f.park == f.park_gen) continue;  // still waiting
        cur = &f;
        threadIdx = uint3{static_cast<unsigned>(t), 0, 0};
        enter(t);
        if (!_setjmp(sched_jb)) {
          if (!f.started) {
            f.started = true;
            setcontext(&f.uc);
          } else {
            _longjmp(f.jb, 1);
          }
        }
        leave(t);
        if (f.done) ++done;
      }
      if (done < nthreads && progress == before && g_pdl_before) {
        bool held = false;  // a thread waits for the predecessor, and no thread can move without it
        for (int t = 0; t < nthreads; ++t) held |= !fibers[t].done && fibers[t].park == &g_pdl_gen;
        if (held) {
          pdl_release();
          continue;
        }
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
    if (written && g_pdl_before) {
      pdl_release();
      fail("block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
           ") of a programmatic launch ended with no thread past griddepcontrol.wait: its grid could complete "
           "before its predecessor, and its reads ran against memory the predecessor had not written");
    }
    check_banks();
  }
}
}  // namespace
}  // namespace sim
