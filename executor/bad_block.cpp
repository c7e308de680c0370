// The delayed bad-block report (bad_block.hpp).
#include "executor/bad_block.hpp"

#include <climits>
#include <string>

#include "decodegraph/error.hpp"

namespace decodegraph::detail {

BadBlockReport::BadBlockReport(const ExecutorConfig& config, Backend& backend, Allocations& memory)
    : cfg_(config), backend_(backend) {
  flag_ = static_cast<int*>(memory.device(kDeviceBytes));  // zeroed
  flag_h_ = static_cast<int*>(memory.host(sizeof(int)));
  *flag_h_ = 0;  // cudaMallocHost does not zero
}

// The pinned flag is read without a CUDA call: a 4-byte aligned DMA write is seen whole or not at
// all, and the flag only goes from 0 to a reported entry until it is reset here. Resetting waits
// for the last step first, so no graph still in flight can copy the old value back afterwards.
void BadBlockReport::report(bool wait, long long steps) {
  if (wait) backend_.wait_last_step();
  if (*static_cast<volatile int*>(flag_h_) == 0) {
    if (wait) reported_through_ = steps;
    return;
  }
  if (!wait) backend_.wait_last_step();
  const int v = *static_cast<volatile int*>(flag_h_);
  const int zero = 0;
  backend_.upload(flag_, &zero, sizeof zero);
  *static_cast<volatile int*>(flag_h_) = 0;
  ++reports_;
  const long long from = reported_through_ + 1;
  reported_through_ = steps;
  const std::string when = from == steps ? "step " + std::to_string(steps)
                                         : "one of steps " + std::to_string(from) + ".." + std::to_string(steps) +
                                               ", those since the last report";
  std::string entry = "inputs.block_tables (an entry past index INT_MAX)";
  std::string seq = "one sequence";
  if (v != INT_MAX) {
    const int flat = v - 1;
    const int stride = cfg_.max_blocks_per_seq;
    entry = "inputs.block_tables[" + std::to_string(flat / stride) + "][" + std::to_string(flat % stride) + "]";
    seq = "sequence " + std::to_string(flat / stride);
  }
  throw InvalidArgument(entry + " = (value not recorded) is invalid; allowed: 0..num_blocks-1 = 0.." +
                        std::to_string(cfg_.num_blocks - 1) + ". A previous step (" + when +
                        ") read this block id: ValidationLevel::kCheap leaves block ids to "
                        "the caller, and the kernels clamped it into the cache, so that step's output for " + seq +
                        " is wrong. Reported once; the executor is usable and the next step runs.");
}

}  // namespace decodegraph::detail
