// Test helpers: seeded random data, and the tolerance check |out - ref| <= atol + rtol*|ref| that
// reports the worst element with its (seq, head, d) indices, the first mismatches, and any NaN.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "decodegraph/numeric.hpp"
#include "decodegraph/types.hpp"
#include "kernels/fp8_fields.hpp"

namespace dgtest {

using decodegraph::DType;

/// Runs fn, which must throw a decodegraph::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no Error thrown; expected one mentioning " << parts.front();
  } catch (const decodegraph::Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

/// Uniform random values in [lo, hi), rounded to dtype, into n elements of buf.
inline void fill_uniform(DType dtype, void* buf, std::size_t n, std::mt19937_64& rng, float lo = -1.f,
                         float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (std::size_t i = 0; i < n; ++i) decodegraph::store_from_float(dtype, buf, i, dist(rng));
}

/// Bytes for n elements of dtype, as a vector of 16-byte-aligned storage.
struct Buffer {
  std::vector<std::uint64_t> words;
  std::size_t bytes = 0;
  Buffer() = default;
  explicit Buffer(std::size_t nbytes) : words((nbytes + 15) / 16 * 2 + 2, 0), bytes(nbytes) {}
  void* data() { return words.data(); }
  const void* data() const { return words.data(); }
};
inline Buffer make_buffer(DType dtype, std::size_t n) {
  return Buffer(n * decodegraph::dtype_size(dtype));
}

/// The value of an fp8 code, spelled out from its bit fields (kernels/fp8_fields.hpp), independently
/// of the library's codecs: the tests' yardstick for them.
using decodegraph::detail::fp8_value;

/// Writes a NaN pattern into every element so untouched outputs are visible.
inline void poison(DType dtype, void* buf, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) decodegraph::store_from_float(dtype, buf, i, NAN);
}

/// Compares out (dtype) with ref (float64) over rows [num_seqs, num_heads, head_size], skipping rows
/// whose mask entry is false (mask may be empty = all rows).
inline ::testing::AssertionResult check_close(DType dtype, const void* out, const double* ref,
                                              int num_seqs, int num_heads, int head_size, double atol,
                                              double rtol, const std::vector<bool>& row_mask = {}) {
  double worst = -1, worst_excess = -1e300;
  std::size_t worst_i = 0;
  int bad = 0, nans = 0;
  std::ostringstream first;
  const std::size_t n = static_cast<std::size_t>(num_seqs) * num_heads * head_size;
  auto where = [&](std::size_t i) {
    std::ostringstream w;
    w << "(seq " << i / (static_cast<std::size_t>(num_heads) * head_size) << ", head "
      << (i / head_size) % num_heads << ", d " << i % head_size << ")";
    return w.str();
  };
  for (std::size_t i = 0; i < n; ++i) {
    const int seq = static_cast<int>(i / (static_cast<std::size_t>(num_heads) * head_size));
    if (!row_mask.empty() && !row_mask[seq]) continue;
    const double o = decodegraph::load_as_float(dtype, out, i);
    const double r = ref[i];
    const double err = std::fabs(o - r);
    const double allowed = atol + rtol * std::fabs(r);
    if (std::isnan(o)) ++nans;
    if (std::isnan(o) || err > allowed) {
      if (bad < 5) first << "  " << where(i) << ": out " << o << " ref " << r << "\n";
      ++bad;
    }
    const double excess = std::isnan(o) ? 1e300 : err - allowed;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = err;
      worst_i = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " elements out of tolerance (atol " << atol << ", rtol " << rtol
         << "), " << nans << " NaN; worst |err| " << worst << " at " << where(worst_i) << " (out "
         << decodegraph::load_as_float(dtype, out, worst_i) << ", ref " << ref[worst_i]
         << ")\nfirst mismatches:\n"
         << first.str();
}

/// Records each skipped test with its reason, one "Suite.Name<TAB>reason" line appended to the file
/// $DG_SKIP_LOG names (set by ctest: tests/CMakeLists.txt), which ctest prints after the run
/// (tests/print_skips.cmake): ctest itself shows a skipped test only as ***Skipped. One short
/// append per skip, so parallel tests do not interleave.
class SkipRecorder : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult* r = info.result();
    const char* path = std::getenv("DG_SKIP_LOG");
    if (r == nullptr || !r->Skipped() || path == nullptr || *path == '\0') return;
    std::string reason;
    for (int i = 0; i < r->total_part_count() && reason.empty(); ++i)
      if (r->GetTestPartResult(i).skipped()) reason = r->GetTestPartResult(i).message();
    for (char& c : reason)
      if (c == '\n' || c == '\t' || c == '\r') c = ' ';
    const std::string line = std::string(info.test_suite_name()) + "." + info.name() + "\t" + reason + "\n";
    if (std::FILE* f = std::fopen(path, "a")) {
      std::fputs(line.c_str(), f);
      std::fclose(f);
    }
  }
};
/// Installed once per test binary, before main (gtest_main) runs the tests.
inline const bool kSkipRecorderInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SkipRecorder);
  return true;
}();

/// Skips the current test unless a CUDA device is present, saying why.
#define DG_REQUIRE_GPU()                                                                     \
  do {                                                                                       \
    if (!decodegraph::cuda_device_available())                                               \
      GTEST_SKIP() << "no CUDA device present (or built without CUDA): GPU test not run";     \
  } while (0)

}  // namespace dgtest
