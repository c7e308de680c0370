// Error kinds (error.hpp), each raised by a real throw site of the library: InvalidArgument from the
// validation helpers, OutOfMemory from a failed host allocation and from an injected allocation
// fault, CudaError (code, not sticky) from an injected fault at every other CUDA site. Catching
// Error still catches each of them, and the executor stays usable afterwards.
#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/fault.hpp"
#include "rel_util.hpp"

namespace dgrel {
namespace {

using fault::Site;

enum class Kind { kNone, kPlainError, kInvalidArgument, kOutOfMemory, kCudaError, kOther };

const char* name(Kind k) {
  switch (k) {
    case Kind::kNone: return "nothing thrown";
    case Kind::kPlainError: return "plain Error";
    case Kind::kInvalidArgument: return "InvalidArgument";
    case Kind::kOutOfMemory: return "OutOfMemory";
    case Kind::kCudaError: return "CudaError";
    case Kind::kOther: return "not a decodegraph::Error";
  }
  return "?";
}

/// What fn throws, caught the way an engine would: as Error, then told apart by kind.
struct Caught {
  Kind kind = Kind::kNone;
  std::string what;
  int code = -1;
  bool context_lost = false;
};
Caught catch_kind(const std::function<void()>& fn) {
  Caught c;
  try {
    fn();
  } catch (const Error& e) {
    c.what = e.what();
    if (const auto* ce = dynamic_cast<const CudaError*>(&e)) {
      c.kind = Kind::kCudaError;
      c.code = ce->code();
      c.context_lost = ce->context_lost();
    } else if (dynamic_cast<const OutOfMemory*>(&e)) {
      c.kind = Kind::kOutOfMemory;
    } else if (dynamic_cast<const InvalidArgument*>(&e)) {
      c.kind = Kind::kInvalidArgument;
    } else {
      c.kind = Kind::kPlainError;
    }
  } catch (...) {
    c.kind = Kind::kOther;
  }
  return c;
}

struct Disarm {
  ~Disarm() { fault::disarm_all(); }
};

// ---------------------------------------------------------------- the hierarchy itself

TEST(ErrorKinds, AreDistinctSubclassesOfError) {
  static_assert(std::is_base_of_v<Error, InvalidArgument>);
  static_assert(std::is_base_of_v<Error, OutOfMemory>);
  static_assert(std::is_base_of_v<Error, CudaError>);
  static_assert(!std::is_base_of_v<InvalidArgument, OutOfMemory> && !std::is_base_of_v<CudaError, OutOfMemory>);
  static_assert(!std::is_base_of_v<InvalidArgument, CudaError> && !std::is_base_of_v<OutOfMemory, CudaError>);
  // Each kind is caught by its own handler and not by a sibling's.
  EXPECT_EQ(catch_kind([] { throw OutOfMemory("x"); }).kind, Kind::kOutOfMemory);
  EXPECT_EQ(catch_kind([] { throw CudaError("x", 1); }).kind, Kind::kCudaError);
  EXPECT_EQ(catch_kind([] { throw_invalid("p", 3, "4"); }).kind, Kind::kInvalidArgument);
}

TEST(ErrorKinds, StickyCudaErrorsMarkTheContextLost) {
  // Values from the CUDA runtime's documentation (driver_types.h): the errors after which "any
  // further CUDA work will return the same error".
  for (int code : {214, 226, 700, 702, 710, 714, 715, 716, 717, 718, 719, 911}) {
    EXPECT_TRUE(cuda_error_is_sticky(code)) << code;
    EXPECT_TRUE(CudaError("x", code).context_lost()) << code;
  }
  // Recoverable: success, invalid value (1), memory allocation (2), invalid device function (98),
  // no device (100), not ready (600), out of resources (701), graph update failure (910), unknown.
  for (int code : {0, 1, 2, 98, 100, 600, 701, 910, 999}) {
    EXPECT_FALSE(cuda_error_is_sticky(code)) << code;
    const CudaError e("x", code);
    EXPECT_FALSE(e.context_lost()) << code;
    EXPECT_EQ(e.code(), code);
  }
}

// ---------------------------------------------------------------- InvalidArgument

TEST(ErrorKinds, BadInputIsInvalidArgumentEverywhere) {
  // Configuration (Executor constructor).
  {
    Rig rig;
    rig.cfg.spec.head_size = 100;
    const Caught c = catch_kind([&] { Executor ex(rig.cfg); });
    EXPECT_EQ(c.kind, Kind::kInvalidArgument) << name(c.kind) << ": " << c.what;
    EXPECT_NE(c.what.find("head_size = 100 is invalid"), std::string::npos) << c.what;
  }
  // Step inputs (Executor::step), and the executor is still usable after it.
  {
    Rig rig;
    Executor ex(rig.cfg);
    rig.fill_step_buffers(ex);
    Inputs in = rig.random_inputs(3, 1, 900);
    in.seq_lens[1] = rig.cfg.max_seq_len + 1;
    const Caught c = catch_kind([&] { ex.step(in.view()); });
    EXPECT_EQ(c.kind, Kind::kInvalidArgument) << name(c.kind) << ": " << c.what;
    const Inputs ok = rig.random_inputs(3, 1, 900);
    ex.step(ok.view());
    EXPECT_TRUE(rig.check_step(ex, ok));
  }
  // Parsers and validate_spec.
  EXPECT_EQ(catch_kind([] { parse_dtype("fp8"); }).kind, Kind::kInvalidArgument);
  EXPECT_EQ(catch_kind([] { parse_layout("hnd"); }).kind, Kind::kInvalidArgument);
  // An explicit log level is the caller's argument.
  {
    Rig rig;
    rig.cfg.log_level = "loud";
    const Caught c = catch_kind([&] { Executor ex(rig.cfg); });
    EXPECT_EQ(c.kind, Kind::kInvalidArgument) << name(c.kind) << ": " << c.what;
    EXPECT_NE(c.what.find("log_level = loud"), std::string::npos) << c.what;
  }
}

// ---------------------------------------------------------------- OutOfMemory

#if defined(__SANITIZE_ADDRESS__)
#define DG_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DG_UNDER_ASAN 1
#endif
#endif

TEST(ErrorKinds, HostAllocationFailureIsOutOfMemory) {
#ifdef DG_UNDER_ASAN
  GTEST_SKIP() << "AddressSanitizer aborts on an allocation above its 1 TiB limit instead of returning "
                  "null; the ordinary build runs this test";
#endif
  // A block table of 65535 rows (the most a launch takes) x 2^30 blocks x 4 bytes ~ 256 TiB: past
  // any machine's memory and the 47-bit user address space, so the host backend's aligned_alloc
  // returns null.
  Rig rig(DType::kFloat32, KVLayout::kNHD, 1, 1);
  rig.cfg.max_batch = kMaxSeqsPerLaunch;
  rig.cfg.batch_buckets = {kMaxSeqsPerLaunch};
  rig.cfg.max_seq_len = 1 << 29;
  rig.cfg.max_blocks_per_seq = 1 << 30;
  rig.cfg.v2_threshold = 8192;
  rig.cfg.band_edges = {8192, 1 << 29};
  const Caught c = catch_kind([&] { Executor ex(rig.cfg); });
  EXPECT_EQ(c.kind, Kind::kOutOfMemory) << name(c.kind) << ": " << c.what;
  EXPECT_NE(c.what.find("bytes failed: out of memory"), std::string::npos) << c.what;
}

TEST(ErrorKinds, InjectedAllocationFaultIsOutOfMemory) {
  Disarm guard;
  Rig rig;
  fault::arm(Site::kAlloc, 1);  // the second allocation of the constructor
  const Caught c = catch_kind([&] { Executor ex(rig.cfg); });
  EXPECT_EQ(c.kind, Kind::kOutOfMemory) << name(c.kind) << ": " << c.what;
  EXPECT_NE(c.what.find("injected fault (site alloc)"), std::string::npos) << c.what;
  fault::disarm_all();
  Executor ex(rig.cfg);  // nothing was left half-built
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(4, 1, 1000);
  ex.step(in.view());
  EXPECT_TRUE(rig.check_step(ex, in));
}

// ---------------------------------------------------------------- CudaError

class InjectedCudaFault : public ::testing::TestWithParam<Site> {};

// Every CUDA-call site a step reaches on the host backend (lazy capture, then replay). Injected
// faults are recoverable CudaErrors with code kInjectedFaultCode (cudaErrorUnknown).
TEST_P(InjectedCudaFault, IsARecoverableCudaError) {
  Disarm guard;
  Rig rig;
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(5, 1, 1000);
  fault::arm(GetParam());
  const Caught c = catch_kind([&] { ex.step(in.view()); });
  EXPECT_EQ(fault::fired(GetParam()), 1);
  ASSERT_EQ(c.kind, Kind::kCudaError) << name(c.kind) << ": " << c.what;
  EXPECT_EQ(c.code, kInjectedFaultCode);
  EXPECT_EQ(c.code, 999);  // cudaErrorUnknown, spelled out so a changed constant fails here
  EXPECT_FALSE(c.context_lost);
  EXPECT_NE(c.what.find(std::string("injected fault (site ") + fault::to_string(GetParam()) + ")"),
            std::string::npos)
      << c.what;
  fault::disarm_all();
  ex.step(in.view());
  EXPECT_TRUE(rig.check_step(ex, in));
}

INSTANTIATE_TEST_SUITE_P(Sites, InjectedCudaFault,
                         ::testing::Values(Site::kMemcpy, Site::kCaptureBegin, Site::kCaptureEnd,
                                           Site::kInstantiate, Site::kGraphLaunch, Site::kKernelLaunch),
                         [](const ::testing::TestParamInfo<Site>& info) {
                           std::string n;
                           for (char ch : std::string(fault::to_string(info.param)))
                             n += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

}  // namespace
}  // namespace dgrel
