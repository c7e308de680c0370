// Host simulator of the CUDA subset used by decodegraph kernels (see tests/sim/README.md): every
// CUDA thread is a fiber; __syncthreads / __syncwarp / __shfl_*_sync are real rendezvous points
// (a thread that skips one deadlocks its block, which is reported; threads that exit no longer
// count; threads at different __syncthreads call sites fail); blocks run serially in a shuffled
// order; between sync points threads run forward, reverse or shuffled (DECODEGRAPH_SIM_ORDER or
// sim::set_order); __shared__ arrays are NaN-filled per block; __ldg is checked against the
// allocation bounds and alignment; cp.async copies are deferred to their wait and visible to other
// threads only after a barrier (sim_device_ops.hpp, sim_runtime.cpp "cp.async visibility");
// programmatic dependent launch (cudaLaunchKernelEx with the programmatic stream serialization
// attribute) runs the dependent's code before its griddepcontrol.wait against memory its
// predecessor has not written yet (sim_runtime.cpp, "programmatic dependent launch").
#pragma once
#define DECODEGRAPH_SIM 1  // the tests check this to be sure the shims, not the toolkit, were found
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

// Aligned as CUDA's vector_types.h declares them, so that the alignment check (CMakeLists.txt:
// -fsanitize=alignment on the kernels) fails a misaligned vector access, which faults on a GPU.
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(8) uint2 { unsigned x, y; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 { unsigned x, y, z; };

struct CUstream_st;
typedef CUstream_st* cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9, cudaErrorNoDevice = 100 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
const char* cudaGetErrorName(cudaError_t);
const char* cudaGetErrorString(cudaError_t);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int*);
cudaError_t cudaMalloc(void**, size_t);
template <typename T> cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
cudaError_t cudaFree(void*);
cudaError_t cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind);
cudaError_t cudaMemset(void*, int, size_t);
cudaError_t cudaDeviceSynchronize();

// cudaLaunchKernelEx's subset the launchers use (kernels/kernel_launch.hpp): grid, block, stream and
// the programmatic stream serialization attribute (PDL); any other attribute fails the test.
enum cudaLaunchAttributeID { cudaLaunchAttributeIgnore = 0, cudaLaunchAttributeProgrammaticStreamSerialization = 6 };
union cudaLaunchAttributeValue {
  unsigned int programmaticStreamSerializationAllowed;
  char pad[64];
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
// The simulator has no SM model: one resident block, so callers see a valid (if pessimistic) answer.
template <typename K>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, K, int, size_t) {
  *n = 1;
  return cudaSuccess;
}

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __maxnreg__(...)

extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

namespace sim {
// A block barrier at one call site (file, line): every thread that has not exited must arrive at
// the same one (PTX bar.sync is barrier.sync.aligned).
void syncthreads(const char* file, unsigned line);
// Block barriers completed since the process started (the CUB shim dates its TempStorage use).
long barrier_epoch();
void syncwarp(unsigned mask);
float shfl_xor(unsigned mask, float v, int off);
float shfl_idx(unsigned mask, float v, int src_lane, int width);
void check_range(const void* p, size_t n, const char* what);
void fail(const std::string& msg);
void register_shared(void* p, size_t n);
// Fails unless [p, p + n) lies inside one registered __shared__ array and p is n-aligned.
void check_shared(const void* p, size_t n, const char* what);
// check_shared(p, 16) for a 16-byte shared load by this thread, which must also see the bytes: no
// cp.async into them in flight, and one another thread landed needs a barrier since its wait.
void shared_load16(const void* p, const char* what);
// Bank-conflict model: records one 16-byte shared access (a load, or a cp.async destination) made at
// source line `site`; accesses by the lanes of a warp at the same site and occurrence form one
// warp instruction (see sim_runtime.cpp). On by default; DECODEGRAPH_SIM_BANKS=0 turns it off.
void shared_access(const void* p, unsigned site);
// cp.async model (per thread): issue, close the open group, wait until at most n groups are pending.
void cp_async(void* dst, const void* src, int src_bytes);
// Two 8-byte cp.async into the halves of one 16-byte chunk by this thread (dst 16-byte aligned, each
// source 8-byte aligned, 0..8 bytes read from each), modelled as one copy of the chunk.
void cp_async_halves(void* dst, const void* src_lo, int n_lo, const void* src_hi, int n_hi);
void cp_async_commit();
void cp_async_wait(int n);
// Tensor-core model (sim_runtime.cpp, "tensor cores"): warp-collective rendezvous like the shuffles,
// all 32 lanes at the same call site. ldmatrix .x{num}{.trans}: this lane's row address (lanes
// 0 .. 8*num-1 are read); the registers follow the PTX fragment layout. mma.m16n8k16 with fp32
// accumulation: d += A * B, A (4 registers) and B (2) of bf16 or fp16 pairs.
void ldmatrix(int num, bool trans, uint32_t* r, const void* row, unsigned site);
void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, unsigned site);
// Warp-level mma operations completed since the process started (tests check that a path ran).
long mma_count();
// Thread order between sync points. kFromEnv reads DECODEGRAPH_SIM_ORDER (fwd, rev, shuffle).
enum class Order { kFromEnv, kForward, kReverse, kShuffle };
void set_order(Order o);
const char* order_name();
// Runs fn once per thread of every block, now (after any launch still deferred: see enqueue).
void launch(const std::function<void()>& fn, dim3 grid, dim3 block, size_t smem);
// Programmatic dependent launch (sim_runtime.cpp, "programmatic dependent launch"). A stream launch
// (sim_launch, cudaLaunchKernelEx) is deferred until the next launch, runtime call (cudaMemcpy,
// cudaMemset, cudaFree, cudaDeviceSynchronize) or flush(). When the next launch is programmatic,
// the deferred kernel runs first with its global writes recorded, and then, in every block of the
// dependent, those bytes read as 0xff poison and every allocation is read-only until a thread of
// the block reaches griddepcontrol.wait (as late as the block's other threads allow: the wait
// returns only once every other thread is parked or exited). A store before the wait, or a block
// that ends without any thread waiting, fails the test.
void enqueue(std::function<void()> fn, dim3 grid, dim3 block, size_t smem, bool programmatic);
void flush();
void grid_dependency_wait();
void launch_dependents();
// Launches so far that ran the PDL model, waits that had to hold a block back, triggers issued.
struct PdlCounts {
  long modelled_launches = 0, held_waits = 0, triggers = 0;
};
PdlCounts pdl_counts();
}  // namespace sim

inline void __syncthreads(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  sim::syncthreads(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { sim::syncwarp(mask); }
inline float __shfl_xor_sync(unsigned mask, float v, int off, int width = 32) {
  if (width != 32) sim::fail("shfl width");
  return sim::shfl_xor(mask, v, off);
}
inline float __shfl_sync(unsigned mask, float v, int src_lane, int width = 32) {
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) sim::fail("shfl width");
  return sim::shfl_idx(mask, v, src_lane, width);
}
// Threads never run concurrently in the simulator, so a plain read-compare-write is atomic.
inline int atomicCAS(int* address, int compare, int val) {
  sim::check_range(address, sizeof(int), "atomicCAS");
  const int old = *address;
  if (old == compare) *address = val;
  return old;
}
template <typename T> inline T __ldg(const T* p) {
  sim::check_range(p, sizeof(T), "__ldg");
  return *p;
}

template <typename K, typename P>
void sim_launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t, const P& params) {
  if (block.x * block.y * block.z > 1024 || grid.y > 65535 || grid.z > 65535) {
    sim::fail("invalid launch configuration");
  }
  sim::enqueue([kernel, params] { kernel(params); }, grid, block, smem, false);
}

struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes = 0;
  cudaStream_t stream = nullptr;
  cudaLaunchAttribute* attrs = nullptr;
  unsigned int numAttrs = 0;
};
// The runtime's C++ template (cuda_runtime.h): the arguments are copied at the launch, as CUDA does.
template <typename... Exp, typename... Act>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Exp...), Act&&... args) {
  bool programmatic = false;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization)
      programmatic = config->attrs[i].val.programmaticStreamSerializationAllowed != 0;
    else if (config->attrs[i].id != cudaLaunchAttributeIgnore)
      sim::fail("cudaLaunchKernelEx: a launch attribute the simulator does not model");
  }
  const dim3 grid = config->gridDim, block = config->blockDim;
  if (block.x * block.y * block.z > 1024 || grid.y > 65535 || grid.z > 65535) sim::fail("invalid launch configuration");
  std::function<void()> fn = [kernel, ... a = static_cast<std::decay_t<Exp>>(args)] { kernel(a...); };
  sim::enqueue(std::move(fn), grid, block, config->dynamicSmemBytes, programmatic);
  return cudaSuccess;
}
