// Random block tables for the benchmarks, made on the device: a seeded permutation of the block ids
// 0..n-1, which the caller slices into disjoint tables (one per rotation), so no two tables share a
// block and consecutive entries of a table are far apart in the cache, as in a fragmented pool.
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/random.h>
#include <thrust/shuffle.h>

#include "bench_common.hpp"

namespace dgbench {

void shuffled_block_ids_device(int32_t* ids, std::size_t n, std::uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  // Thrust: a uniform random permutation of millions of ids is shuffle_copy of a counting iterator
  // (a Feistel bijection and one scan; the same as sequence + shuffle without the temporary copy).
  const thrust::counting_iterator<int32_t> first(0);
  thrust::default_random_engine rng(static_cast<thrust::default_random_engine::result_type>(seed ^ (seed >> 32)));
  thrust::shuffle_copy(thrust::cuda::par_nosync.on(stream), first, first + static_cast<std::ptrdiff_t>(n), ids, rng);
}

}  // namespace dgbench
