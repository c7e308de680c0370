// Launch probe of the kernel report (scripts/kernel_report.py). It calls every launcher that
// kernels/inst/*.cu instantiates (the list, probe_instances.inc, is generated from the objects'
// symbols) with a representative problem, linked against fake_cudart.cpp instead of cudart, and
// prints one line per launch: the kernel's mangled name, its block size and dynamic shared memory
// as the launcher chose them, and the hints the SASS count needs (K+V bytes and tokens per
// main-loop iteration, tokens per row for loops whose bound is a runtime value).
//
// This file is the one place that knows the launchers' signatures and the pass-1 policy. When the
// kernels change them, change it here; kernel_report.py stays as it is.
//
// Usage: probe GROUP[xQ_LEN]... (GQA group sizes for the pass-1 launches, each with the query rows
// per sequence, DecodeParams::q_len, default 1: "4x4" is group 4 with 4 rows). Output: "launch key=value ..."
// lines; a launcher that throws prints "error ..." and the probe exits 1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "fake_cudart.hpp"
#include "kernels/decode_params.cuh"
#include "kernels/decode_policy.hpp"

// The probe is never fault-injected; the launchers only ask (and would throw through throw_injected).
namespace decodegraph::fault {
bool should_fail(Site) { return false; }
[[noreturn]] void throw_injected(Site, const std::string& call) {
  std::printf("error %s: injected fault in the probe\n", call.c_str());
  std::exit(1);
}
}  // namespace decodegraph::fault
// The fake runtime never fails, so no CudaError is built; the error kinds only need the symbol.
namespace decodegraph {
bool cuda_error_is_sticky(int) { return false; }
}  // namespace decodegraph

namespace {

using namespace decodegraph;
using namespace decodegraph::kernels;

template <typename T>
constexpr const char* dtype_name() {
  if constexpr (std::is_same_v<T, __half>) return "fp16";
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return "bf16";
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) return "fp8e4m3";
  if constexpr (std::is_same_v<T, __nv_fp8_e5m2>) return "fp8e5m2";
  return "unknown";
}

std::function<void(const FakeLaunch&)> g_on_launch;
int g_launches = 0;

// Any non-null, 256-byte aligned address: nothing is dereferenced on the host.
template <typename P>
P fake_ptr(std::uintptr_t i) {
  return reinterpret_cast<P>(static_cast<std::uintptr_t>(0x10000000) * (i + 1));
}

void print_launch(const char* family, const FakeLaunch& l, const std::string& extra) {
  std::printf("launch family=%s kernel=%s threads=%u dynamic_smem=%zu %s\n", family, l.kernel ? l.kernel : "?",
              l.block[0] * l.block[1] * l.block[2], l.dynamic_smem, extra.c_str());
}

/// Runs `launch` and checks that it launched exactly one kernel. `may_reject`: an Error from the
/// launcher only means the combination is not supported.
template <typename F>
void expect_one_launch(const char* what, F&& launch, bool may_reject = false) {
  const int before = g_launches;
  try {
    launch();
  } catch (const Error& e) {
    if (may_reject) return;
    std::printf("error %s: %s\n", what, e.what());
    std::exit(1);
  }
  if (g_launches != before + 1) {
    std::printf("error %s: expected one launch, saw %d\n", what, g_launches - before);
    std::exit(1);
  }
}

std::vector<std::pair<int, int>> g_groups;  // (group, q_len)

// ---------------------------------------------------------------- pass 1 (V1 and V2)
// Hints (per launch, from the policy, kernels/decode_policy.hpp):
//   tile_tokens   tokens one main-loop iteration stages (Pass1Policy::kTileTokens; the tensor-core
//                 math's TcPass1Policy has the same tiles; fp8 caches: Pass1Policy<1, D>)
//   kv_tile_bytes K + V bytes of those tokens (one byte a value for fp8 caches)
//   row_tokens    tokens per row per tile (Pass1Policy::kRowTokens): the trip count of per-token
//                 loops, should the compiler leave one rolled
// launch_paged_decode picks the math by the group (pass1_uses_tensor_cores): groups >= 4 of fp16 /
// bf16 launch the tensor-core kernel, so the default groups 1,4,8 reach both maths; fp8 caches
// (KV = __nv_fp8_e4m3 / __nv_fp8_e5m2, T = __half) launch the tensor-core kernel at every group,
// reported under the cache's name (dtype=fp8e4m3), with a bf16 model (io_bf16; the main loop is the
// same for fp16).
// The layout is a template parameter; every block size is launched, so a kernel that also took it
// as a template parameter would show each variant. kernel_report.py drops repeated (kernel, group)
// launches.
template <typename T, typename KV, int D, KVLayout kLayout>
void probe_pass1() {
  using Pol = Pass1Policy<sizeof(KV), D>;
  constexpr bool kFp8 = sizeof(KV) == 1;
  for (const auto& [group, q_len] : g_groups)
  for (const int block_size : {8, 16, 32}) {
    for (const bool v2 : {false, true}) {
      DecodeParams p;
      p.q = fake_ptr<const void*>(0);
      p.out = fake_ptr<void*>(1);
      p.k_cache = fake_ptr<const void*>(2);
      p.v_cache = fake_ptr<const void*>(3);
      p.block_tables = fake_ptr<const int32_t*>(4);
      p.seq_lens = fake_ptr<const int32_t*>(5);
      p.num_seqs = 1;
      p.num_kv_heads = 8;
      p.num_q_heads = 8 * group;
      p.q_len = q_len;
      p.num_blocks = 1 << 20;
      p.block_size = block_size;
      p.layout = kLayout;
      p.max_seq_len = 32768;
      p.block_table_stride = p.max_seq_len / p.block_size;
      p.partition_size = v2 ? 512 : p.max_seq_len;
      p.max_partitions = v2 ? p.max_seq_len / 512 : 1;
      p.write_partials = v2;
      if (kFp8) {
        p.k_scale = fake_ptr<const float*>(9);
        p.v_scale = fake_ptr<const float*>(10);
        p.io_bf16 = true;
      }
      if (v2) {
        p.max_logits = fake_ptr<float*>(6);
        p.exp_sums = fake_ptr<float*>(7);
        p.partial_out = fake_ptr<float*>(8);
      }
      g_on_launch = [&](const FakeLaunch& l) {
        print_launch("pass1", l,
                     std::string("dtype=") + dtype_name<KV>() + " head_size=" + std::to_string(D) +
                         " group=" + std::to_string(group) + " q_len=" + std::to_string(q_len) +
                         " tile_tokens=" + std::to_string(Pol::kTileTokens) +
                         " kv_tile_bytes=" + std::to_string(2 * Pol::kTileTokens * D * sizeof(KV)) +
                         " row_tokens=" + std::to_string(Pol::kRowTokens));
      };
      expect_one_launch("launch_paged_decode", [&] { launch_paged_decode<T, KV, D, kLayout>(p, nullptr); });
    }
  }
}

// ---------------------------------------------------------------- merge (V2 pass 2)
// Its block depends on the head size only; reported at head size 128.
template <typename T>
void probe_merge() {
  MergeParams p;
  p.max_logits = fake_ptr<const float*>(0);
  p.exp_sums = fake_ptr<const float*>(1);
  p.partial_out = fake_ptr<const float*>(2);
  p.out = fake_ptr<void*>(3);
  p.seq_lens = fake_ptr<const int32_t*>(4);
  p.num_seqs = 1;
  p.num_q_heads = 32;
  p.head_size = 128;
  p.max_seq_len = 32768;
  p.partition_size = 512;
  p.max_partitions = 64;
  g_on_launch = [&](const FakeLaunch& l) {
    print_launch("merge", l, std::string("dtype=") + dtype_name<T>() + " head_size=128");
  };
  expect_one_launch("launch_merge_partitions", [&] { launch_merge_partitions<T>(p, nullptr); });
}

// ---------------------------------------------------------------- KV append
template <typename T, typename KV>
void probe_append() {
  AppendParams p;
  p.key = fake_ptr<const void*>(0);
  p.value = fake_ptr<const void*>(1);
  p.k_cache = fake_ptr<void*>(2);
  p.v_cache = fake_ptr<void*>(3);
  p.slot_mapping = fake_ptr<const int64_t*>(4);
  p.num_tokens = 8;
  p.num_kv_heads = 8;
  p.head_size = 128;
  p.block_size = 16;
  if (sizeof(KV) == 1) {
    p.k_scale = fake_ptr<const float*>(5);
    p.v_scale = fake_ptr<const float*>(6);
  }
  g_on_launch = [&](const FakeLaunch& l) {
    print_launch("append", l, std::string("dtype=") + dtype_name<T>() + (sizeof(KV) == 1 ? std::string("->") + dtype_name<KV>() : "") + " head_size=128");
  };
  expect_one_launch("launch_append_kv", [&] { launch_append_kv<T, KV>(p, nullptr); });
}

}  // namespace

void fake_cudart_on_launch(const FakeLaunch& launch) {
  ++g_launches;
  if (g_on_launch) g_on_launch(launch);
}

void fake_cudart_on_smem_optin(const char* kernel, int bytes) {
  std::printf("smem_optin kernel=%s bytes=%d\n", kernel ? kernel : "?", bytes);
}

// One macro per launcher the probe knows; probe_instances.inc names each instantiation found.
#define DG_PROBE_launch_paged_decode(...) probe_pass1<__VA_ARGS__>();
#define DG_PROBE_launch_merge_partitions(...) probe_merge<__VA_ARGS__>();
#define DG_PROBE_launch_append_kv(...) probe_append<__VA_ARGS__>();

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* x = std::strchr(argv[i], 'x');
    g_groups.emplace_back(std::atoi(argv[i]), x ? std::atoi(x + 1) : 1);
  }
  if (g_groups.empty()) g_groups = {{1, 1}, {4, 1}, {8, 1}};
#include "probe_instances.inc"
  return 0;
}
