// Soak: N host-backend steps (env DECODEGRAPH_SOAK_STEPS, default 2000; the full run is 100000, see
// docs/reliability.md) with random batch sizes, lengths and block tables, KV append on. The first
// step and every 1000th are checked against the float64 reference; every step's bucket and kernel are
// checked against the plan. Memory must stay flat between the end of warm-up and the end:
//   - live heap bytes (ASan's allocator when sanitized, glibc mallinfo2 otherwise): within 64 KiB;
//   - resident set size (/proc/self/statm, unsanitized builds only: ASan's quarantine holds freed
//     memory by design): within 4 MiB.
#include <gtest/gtest.h>

#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "rel_util.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define DG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DG_ASAN 1
#endif
#endif

#ifdef DG_ASAN
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace dgrel {
namespace {

constexpr long long kLiveHeapSlack = 64 * 1024;
constexpr long long kRssSlack = 4 * 1024 * 1024;

long long live_heap_bytes() {
#ifdef DG_ASAN
  return static_cast<long long>(__sanitizer_get_current_allocated_bytes());
#else
  return static_cast<long long>(mallinfo2().uordblks);
#endif
}

long long rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long long size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

long long soak_steps() {
  const char* env = std::getenv("DECODEGRAPH_SOAK_STEPS");
  if (env == nullptr || *env == '\0') return 2000;
  char* end = nullptr;
  const long long n = std::strtoll(env, &end, 10);
  if (*end != '\0' || n < 1) {
    ADD_FAILURE() << "DECODEGRAPH_SOAK_STEPS = \"" << env << "\" is invalid; allowed: a positive integer";
    return 1;
  }
  return n;
}

TEST(Soak, RandomStepsStayCorrectAndMemoryFlat) {
  const long long steps = soak_steps();
  Rig rig(DType::kBFloat16, KVLayout::kVLLM, 2, 8, 1024, 20240611);
  rig.cfg.batch_buckets = {1, 2, 4, 8};
  rig.cfg.capture = CapturePolicy::kUpFront;  // all graphs exist before the memory baseline
  Executor ex(rig.cfg);
  const int num_graphs = ex.stats().distinct_graphs;
  const MemoryReport mem0 = ex.memory();
  std::uniform_int_distribution<int> batch_d(1, rig.cfg.max_batch), band_d(0, 2);
  const int edges[] = {256, 512, 1024};

  const long long warmup = std::min<long long>(200, steps / 4);
  long long heap0 = 0, rss0 = 0, checked = 0, v2_steps = 0;
  for (long long s = 0; s < steps; ++s) {
    if (s == warmup) {
      heap0 = live_heap_bytes();
      rss0 = rss_bytes();
    }
    const int n = batch_d(rig.rng);
    const int hi = edges[band_d(rig.rng)];  // pick a band, then lengths within up to its edge
    const Inputs in = rig.random_inputs(n, 1, hi);
    rig.fill_step_buffers(ex);
    const StepResult r = ex.step(in.view());
    const int longest = *std::max_element(in.seq_lens.begin(), in.seq_lens.end());
    ASSERT_GE(r.bucket_batch_size, n) << "step " << s;
    ASSERT_TRUE(r.band_hi >= longest && (r.band == 0 || edges[r.band - 1] < longest)) << "step " << s;
    ASSERT_EQ(r.kernel, longest > rig.cfg.v2_threshold ? KernelKind::kV2 : KernelKind::kV1) << "step " << s;
    ASSERT_FALSE(r.captured) << "step " << s << ": everything was captured up front";
    v2_steps += r.kernel == KernelKind::kV2;
    if (s % 1000 == 0 || s == steps - 1) {
      ASSERT_TRUE(rig.check_step(ex, in)) << "step " << s;
      ++checked;
    }
  }
  const long long heap1 = live_heap_bytes(), rss1 = rss_bytes();
  const ExecutorStats st = ex.stats();
  EXPECT_EQ(st.steps, steps);
  EXPECT_EQ(st.total_captures, num_graphs) << "no graph may be captured twice";
  EXPECT_GT(v2_steps, 0);
  EXPECT_GT(st.replays(KernelKind::kV1), 0);
  EXPECT_EQ(ex.memory().total(), mem0.total());
  EXPECT_LE(heap1 - heap0, kLiveHeapSlack) << "live heap grew from " << heap0 << " to " << heap1;
#ifndef DG_ASAN
  EXPECT_LE(rss1 - rss0, kRssSlack) << "RSS grew from " << rss0 << " to " << rss1;
#endif
  std::printf("soak: %lld steps, %lld checked against the reference, %lld V2; live heap %lld -> %lld, "
              "RSS %lld -> %lld bytes\n",
              steps, checked, v2_steps, heap0, heap1, rss0, rss1);
  RecordProperty("steps", std::to_string(steps));
}

}  // namespace
}  // namespace dgrel
