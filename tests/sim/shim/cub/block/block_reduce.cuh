// Simulator model of the subset of cub::BlockReduce the kernels use (kernels/band_select.cu):
// BlockReduce<T, BLOCK_DIM_X>(temp).Reduce(value, op) over a 1-D block of exactly BLOCK_DIM_X
// threads. Each thread writes its value into the (NaN-filled, registered) TempStorage, a barrier,
// thread 0 folds them in thread order. As in CUB, the result is defined in thread 0 only (the others
// get numeric_limits<T>::lowest(), so a kernel that reads it elsewhere fails its test), and there
// is no barrier after the fold: CUB leaves it to the caller to place one before the TempStorage is
// reused (the @smemreuse note on Reduce in CCCL's cub/block/block_reduce.cuh). The storage dates
// each write and the fold by barrier epoch, so a reuse without that barrier fails in either thread
// order: a thread that writes while thread 0 may still fold, or a fold that finds a slot written
// after the barrier it waited at.
#pragma once

#include <limits>
#include <string>

#include "sim_runtime.hpp"

namespace cub {

template <typename T, int BLOCK_DIM_X>
class BlockReduce {
 public:
  struct TempStorage {
    T partial[BLOCK_DIM_X];
    long written[BLOCK_DIM_X];  // barrier epoch of each slot's write (NaN fill: -1, never)
    long folded;                // barrier epoch of thread 0's last fold
  };
  explicit BlockReduce(TempStorage& storage) : s_(storage) {}

  template <typename Op>
  T Reduce(T value, Op op) {
    if (blockDim.x != BLOCK_DIM_X || blockDim.y != 1 || blockDim.z != 1)
      sim::fail("cub::BlockReduce<T, " + std::to_string(BLOCK_DIM_X) + "> launched with blockDim.x = " +
                std::to_string(blockDim.x));
    const int tid = static_cast<int>(threadIdx.x);
    sim::check_shared(&s_.partial[tid], sizeof(T), "cub::BlockReduce TempStorage");
    const long e = sim::barrier_epoch();
    if (tid != 0 && s_.folded == e)
      sim::fail("cub::BlockReduce TempStorage reused without a barrier: thread " + std::to_string(tid) +
                " writes it while thread 0 reads the previous Reduce's partials");
    s_.partial[tid] = value;
    s_.written[tid] = e;
    __syncthreads();
    T r = std::numeric_limits<T>::lowest();
    if (tid == 0) {
      const long f = sim::barrier_epoch();
      for (int i = 0; i < BLOCK_DIM_X; ++i)
        if (s_.written[i] != f - 1)
          sim::fail(s_.written[i] == f ? "cub::BlockReduce TempStorage reused without a barrier: thread " +
                                             std::to_string(i) + " overwrote its partial before thread 0 folded it"
                                       : "cub::BlockReduce: thread " + std::to_string(i) + " took no part");
      r = s_.partial[0];
      for (int i = 1; i < BLOCK_DIM_X; ++i) r = op(r, s_.partial[i]);
      s_.folded = f;
    }
    return r;
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
