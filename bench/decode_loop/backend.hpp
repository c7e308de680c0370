// Memory, copies and fills in the backend's memory space (device memory on CUDA, host memory on the
// host backend), and what the run reports about the machine: its name and measured bandwidths.
// The only place in decode_loop with CUDA calls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "decodegraph/decodegraph.hpp"

namespace dgloop {

namespace dg = decodegraph;

/// A buffer in the backend's memory space: device memory on CUDA, 16-byte-aligned host memory on the
/// host backend.
class Buffer {
 public:
  Buffer() = default;
  Buffer(bool device, std::size_t bytes) : device_(device), bytes_(bytes) {
    if (bytes == 0) return;
    if (device) {
#if DECODEGRAPH_HAS_CUDA
      DGB_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
#endif
    } else {
      host_.resize((bytes + 15) / 16);
      ptr_ = host_.data();
    }
  }
  ~Buffer() {
#if DECODEGRAPH_HAS_CUDA
    if (device_ && ptr_) cudaFree(ptr_);
#endif
  }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(bytes_, o.bytes_);
    std::swap(ptr_, o.ptr_);
    std::swap(host_, o.host_);
    return *this;
  }
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  struct alignas(16) Chunk {
    unsigned char b[16];
  };
  bool device_ = false;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
  std::vector<Chunk> host_;
};

/// Pinned host memory on CUDA (fast, truly async staging), plain vectors otherwise.
template <typename T>
class HostArray {
 public:
  HostArray(bool pinned, std::size_t n) : pinned_(pinned), n_(n) {
#if DECODEGRAPH_HAS_CUDA
    if (pinned_) {
      DGB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), std::max<std::size_t>(n, 1) * sizeof(T)));
      std::fill(ptr_, ptr_ + n, T{});
      return;
    }
#endif
    pinned_ = false;
    vec_.assign(n, T{});
    ptr_ = vec_.data();
  }
  ~HostArray() {
#if DECODEGRAPH_HAS_CUDA
    if (pinned_) cudaFreeHost(ptr_);
#endif
  }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  T& operator[](std::size_t i) { return ptr_[i]; }
  std::size_t size() const { return n_; }

 private:
  bool pinned_;
  std::size_t n_;
  T* ptr_ = nullptr;
  std::vector<T> vec_;
};

/// Copies and random fills in the backend's memory space: on `stream` on CUDA (nullptr: the default
/// stream), in place on the host backend.
struct BackendOps {
  bool gpu = false;
  dg::Stream stream = nullptr;

  /// Waits for `stream` (CUDA); nothing on the host backend.
  void sync() const;
  /// Waits for the whole device (CUDA); nothing on the host backend.
  void sync_device() const;
  void to_device_async(void* dst, const void* src, std::size_t bytes) const;
  void to_host(void* dst, const void* src, std::size_t bytes) const;
  /// Seeded random values of `dtype`, never all zero (dgbench::fill_random_*).
  void fill(dg::DType dtype, void* p, std::size_t n, std::uint64_t seed) const;
  /// A KV cache of `spec`: fill for kv_dtype auto, fp8 codes otherwise (dgbench::fill_random_kv_*).
  void fill_kv(const dg::AttentionSpec& spec, void* p, std::size_t n, std::uint64_t seed) const;
};

/// The machine the run reports on: on CUDA the device and its bandwidth measured in this run.
struct Machine {
  std::string name = "CPU";
  int sms = 0;
  dgbench::ReadBandwidth read, copy;  // zero on the host backend
};

/// On CUDA: the device's properties and its read and d2d copy bandwidth, measured now.
Machine measure_machine(bool gpu);

}  // namespace dgloop
