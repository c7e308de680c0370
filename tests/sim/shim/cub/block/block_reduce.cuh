// Simulator model of the subset of cub::BlockReduce the kernels use (kernels/band_select.cu):
// BlockReduce<T, BLOCK_DIM_X>(temp).Reduce(value, op) over a 1-D block of exactly BLOCK_DIM_X
// threads. Each thread writes its value into the (NaN-filled, registered) TempStorage, a barrier,
// thread 0 folds them in thread order, a barrier. As in CUB, the result is defined in thread 0 only:
// the others get numeric_limits<T>::lowest(), so a kernel that reads it elsewhere fails its test.
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
  };
  explicit BlockReduce(TempStorage& storage) : s_(storage) {}

  template <typename Op>
  T Reduce(T value, Op op) {
    if (blockDim.x != BLOCK_DIM_X || blockDim.y != 1 || blockDim.z != 1)
      sim::fail("cub::BlockReduce<T, " + std::to_string(BLOCK_DIM_X) + "> launched with blockDim.x = " +
                std::to_string(blockDim.x));
    sim::check_shared(&s_.partial[threadIdx.x], sizeof(T), "cub::BlockReduce TempStorage");
    s_.partial[threadIdx.x] = value;
    __syncthreads();
    T r = std::numeric_limits<T>::lowest();
    if (threadIdx.x == 0) {
      r = s_.partial[0];
      for (int i = 1; i < BLOCK_DIM_X; ++i) r = op(r, s_.partial[i]);
    }
    __syncthreads();  // CUB leaves this to the caller before reusing the storage; harmless here
    return r;
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
