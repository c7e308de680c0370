// Fault injection through decodegraph::fault: each site fails in turn (the 1st, 2nd, ... call at
// that site) during construction, lazy capture and replay. Each failure must surface as an Error
// naming the call, leave no half-built graph (no capture counted, a later step captures cleanly), leave
// the memory report unchanged (ASan checks the heap itself), and the next valid step must be correct.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "decodegraph/fault.hpp"
#include "rel_util.hpp"

#if DECODEGRAPH_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace dgrel {
namespace {

using fault::Site;

const std::vector<Site> kAllSites = {Site::kAlloc,        Site::kMemcpy,     Site::kCaptureBegin,
                                     Site::kCaptureEnd,   Site::kInstantiate, Site::kGraphUpdate,
                                     Site::kGraphLaunch,  Site::kKernelLaunch};
// Capture-phase sites: a failure there must leave the bucket uncaptured.
const std::set<Site> kCaptureSites = {Site::kCaptureBegin, Site::kCaptureEnd, Site::kInstantiate};

std::string site_name(const ::testing::TestParamInfo<Site>& info) {
  std::string n;
  for (char c : std::string(fault::to_string(info.param)))
    n += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
}

/// Guards against an armed fault leaking into the next test when an assertion returns early.
struct Disarm {
  ~Disarm() { fault::disarm_all(); }
};

// The seam itself: skip/count semantics and fired() bookkeeping.
TEST(FaultSeam, SkipCountAndFired) {
  Disarm guard;
  EXPECT_FALSE(fault::should_fail(Site::kAlloc));
  fault::arm(Site::kAlloc, 2, 2);
  EXPECT_FALSE(fault::should_fail(Site::kMemcpy));
  EXPECT_FALSE(fault::should_fail(Site::kAlloc));
  EXPECT_FALSE(fault::should_fail(Site::kAlloc));
  EXPECT_TRUE(fault::should_fail(Site::kAlloc));
  EXPECT_TRUE(fault::should_fail(Site::kAlloc));
  EXPECT_FALSE(fault::should_fail(Site::kAlloc));
  EXPECT_EQ(fault::fired(Site::kAlloc), 2);
  EXPECT_EQ(fault::fired(Site::kMemcpy), 0);
  fault::disarm(Site::kAlloc);
  EXPECT_EQ(fault::fired(Site::kAlloc), 0);
  {
    fault::ScopedFault f(Site::kGraphLaunch);
    EXPECT_TRUE(fault::should_fail(Site::kGraphLaunch));
  }
  EXPECT_FALSE(fault::should_fail(Site::kGraphLaunch));
  std::set<std::string> names;
  for (Site s : kAllSites) names.insert(fault::to_string(s));
  EXPECT_EQ(names.size(), kAllSites.size()) << "site names must be distinct";
}

class HostFault : public ::testing::TestWithParam<Site> {};

// Up-front capture in the constructor: fail the k-th call at the site for every k the constructor
// reaches. Each failed construction must throw naming the site; ASan's leak check at exit covers the
// unwound allocations.
TEST_P(HostFault, DuringConstructionWithUpFrontCapture) {
  Disarm guard;
  const Site site = GetParam();
  Rig rig;
  rig.cfg.capture = CapturePolicy::kUpFront;
  MemoryReport clean;
  {
    Executor ex(rig.cfg);
    clean = ex.memory();
  }
  int failures = 0;
  for (int skip = 0; skip < 500; ++skip) {
    fault::arm(site, skip, 1);
    bool threw = false;
    try {
      Executor ex(rig.cfg);
    } catch (const Error& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find(fault::to_string(site)), std::string::npos)
          << "skip " << skip << ": \"" << e.what() << "\" does not name " << fault::to_string(site);
    }
    const int fired = fault::fired(site);
    fault::disarm_all();
    EXPECT_EQ(threw, fired > 0) << "skip " << skip << ": an injected failure must surface, and only then";
    if (fired == 0) break;
    ++failures;
  }
  if (site == Site::kAlloc || kCaptureSites.count(site))
    EXPECT_GT(failures, 0) << fault::to_string(site) << " never reached during up-front construction";
  Executor ex(rig.cfg);
  EXPECT_EQ(ex.memory().total(), clean.total());
  EXPECT_EQ(ex.stats().total_captures, ex.stats().distinct_graphs);
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(6, 1, 1024);
  EXPECT_FALSE(ex.step(in.view()).captured);
  EXPECT_TRUE(rig.check_step(ex, in));
  RecordProperty("failures_injected", failures);
}

// One step with the k-th call at `site` failing. Returns whether it failed. Checks the Error names the
// site, the memory report is unchanged, a capture-phase failure left nothing counted, and the next
// valid step captures exactly when no complete graph exists and matches the reference.
bool faulty_step(Rig& rig, Executor& ex, Site site, int skip, int min_len, int max_len, KernelKind kind) {
  const MemoryReport mem0 = ex.memory();
  const ExecutorStats st0 = ex.stats();
  for (int l = 0; l < rig.cfg.num_layers; ++l)
    dgtest::poison(rig.cfg.spec.dtype, ex.output(l), rig.cfg.max_batch * rig.row_elems());
  const Inputs in = rig.random_inputs(3, min_len, max_len);
  fault::arm(site, skip, 1);
  bool threw = false;
  StepResult r;
  try {
    r = ex.step(in.view());
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(fault::to_string(site)), std::string::npos)
        << "skip " << skip << ": \"" << e.what() << "\" does not name " << fault::to_string(site);
  }
  const int fired = fault::fired(site);
  fault::disarm_all();
  EXPECT_EQ(threw, fired > 0) << "skip " << skip << ": an injected failure must surface, and only then";
  EXPECT_EQ(ex.memory().total(), mem0.total()) << "memory report changed by a failed step";
  const ExecutorStats st1 = ex.stats();
  if (!threw) {
    EXPECT_EQ(r.kernel, kind);
    EXPECT_TRUE(rig.check_step(ex, in));
    EXPECT_EQ(st1.total_captures, 1);
    return false;
  }
  EXPECT_LE(st1.total_captures - st0.total_captures, 1);
  if (kCaptureSites.count(site))
    EXPECT_EQ(st1.total_captures, st0.total_captures)
        << "a failed " << fault::to_string(site) << " left a captured graph counted";
  const Inputs good = rig.random_inputs(3, min_len, max_len);
  const StepResult ok = ex.step(good.view());
  EXPECT_EQ(ok.kernel, kind);
  EXPECT_EQ(ok.captured, st1.total_captures == 0) << "skip " << skip;
  EXPECT_TRUE(rig.check_step(ex, good)) << "after a failure at skip " << skip;
  EXPECT_EQ(ex.stats().total_captures, 1) << "bucket captured twice or never";
  EXPECT_EQ(captures_of(ex.stats(), 4, ok.band), 1);
  return true;
}

void lazy_then_replay(Rig& rig, Site site, int min_len, int max_len, KernelKind kind) {
  // The capturing step: a fresh executor per k so the k-th call is always one of the capture.
  int capture_failures = 0;
  for (int skip = 0; skip < 500; ++skip) {
    Executor ex(rig.cfg);
    rig.fill_step_buffers(ex);
    if (!faulty_step(rig, ex, site, skip, min_len, max_len, kind)) break;
    ++capture_failures;
  }
  // Replaying steps of an already captured bucket.
  int replay_failures = 0;
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  const Inputs first = rig.random_inputs(3, min_len, max_len);
  ASSERT_TRUE(ex.step(first.view()).captured);
  for (int skip = 0; skip < 500; ++skip) {
    if (!faulty_step(rig, ex, site, skip, min_len, max_len, kind)) break;
    ++replay_failures;
  }
  if (kCaptureSites.count(site) || site == Site::kGraphLaunch || site == Site::kMemcpy)
    EXPECT_GT(capture_failures, 0) << fault::to_string(site) << " never reached by a capturing step";
  // Steps never allocate (all memory is taken at configuration), so no step can fail for memory.
  if (site == Site::kAlloc) EXPECT_EQ(capture_failures + replay_failures, 0);
  if (site == Site::kGraphLaunch || site == Site::kMemcpy || site == Site::kKernelLaunch)
    EXPECT_GT(replay_failures, 0) << fault::to_string(site) << " never reached by a replaying step";
  ::testing::Test::RecordProperty("capture_failures", capture_failures);
  ::testing::Test::RecordProperty("replay_failures", replay_failures);
}

TEST_P(HostFault, DuringLazyCaptureAndReplayV1) {
  Disarm guard;
  Rig rig(DType::kBFloat16, KVLayout::kVLLM);
  lazy_then_replay(rig, GetParam(), 257, 512, KernelKind::kV1);
}

TEST_P(HostFault, DuringLazyCaptureAndReplayV2) {
  Disarm guard;
  Rig rig(DType::kFloat16, KVLayout::kNHD);
  lazy_then_replay(rig, GetParam(), 513, 1024, KernelKind::kV2);
}

// A step body: a failure while the caller's body is being captured unwinds the capture too.
TEST_P(HostFault, DuringCaptureOfAStepBody) {
  Disarm guard;
  const Site site = GetParam();
  Rig rig;
  int body_runs = 0;
  Executor ex(rig.cfg, [&](StepContext& ctx) {
    ++body_runs;
    for (int l = 0; l < rig.cfg.num_layers; ++l) {
      ctx.append_kv(l);
      ctx.attention(l);
    }
  });
  rig.fill_step_buffers(ex);
  fault::arm(site, 0, 1);
  const Inputs in = rig.random_inputs(2, 1, 200);
  bool threw = false;
  try {
    ex.step(in.view());
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(fault::to_string(site)), std::string::npos) << e.what();
  }
  const bool fired = fault::fired(site) > 0;
  fault::disarm_all();
  EXPECT_EQ(threw, fired);
  const Inputs good = rig.random_inputs(2, 1, 200);
  ex.step(good.view());
  EXPECT_TRUE(rig.check_step(ex, good));
  EXPECT_EQ(ex.stats().total_captures, 1);
  EXPECT_GE(body_runs, 1);
}

// rebind_layers with the k-th call at `site` failing. Whatever fails, config().layers says which
// caches are in effect (the old ones when a re-capture failed, the new ones once updates began), every
// step after it matches the reference over exactly those, and no graph is captured again unless its
// update failed. A refused update alone is no failure: the graph is re-instantiated.
TEST_P(HostFault, DuringRebindLayers) {
  Disarm guard;
  const Site site = GetParam();
  int failures = 0, fired_total = 0;
  // kHost: a V1 graph and a V2 graph; kDevice: one graph of the batch bucket holding both branches.
  for (const BandSelect mode : {BandSelect::kHost, BandSelect::kDevice})
  for (int skip = 0; skip < 100; ++skip) {
    Rig rig(DType::kFloat32, KVLayout::kNHD, 2, 8, 1024, 500 + skip);
    rig.cfg.band_select = mode;
    const int graphs = mode == BandSelect::kHost ? 2 : 1;
    Executor ex(rig.cfg);
    rig.fill_step_buffers(ex);
    const std::pair<int, int> bands[] = {{1, 256}, {600, 1024}};
    for (auto [lo, hi] : bands) ex.step(rig.random_inputs(3, lo, hi).view());
    ASSERT_EQ(ex.stats().total_captures, graphs);
    std::vector<std::vector<std::uint64_t>> nk, nv;
    std::vector<LayerBuffers> layers(rig.cfg.num_layers);
    for (int l = 0; l < rig.cfg.num_layers; ++l) {
      nk.emplace_back(rig.k_caches[l].size());
      nv.emplace_back(rig.v_caches[l].size());
      dgtest::fill_uniform(rig.cfg.spec.dtype, nk.back().data(), rig.cache_elems(), rig.rng);
      dgtest::fill_uniform(rig.cfg.spec.dtype, nv.back().data(), rig.cache_elems(), rig.rng);
      layers[l].k_cache = nk.back().data();
      layers[l].v_cache = nv.back().data();
      layers[l].k_cache_bytes = layers[l].v_cache_bytes = rig.cache_bytes();
    }
    fault::arm(site, skip, 1);
    bool threw = false;
    try {
      ex.rebind_layers(layers);
    } catch (const Error& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find(fault::to_string(site)), std::string::npos) << e.what();
    }
    const int fired = fault::fired(site);
    fault::disarm_all();
    fired_total += fired;
    if (site == Site::kGraphUpdate) {
      EXPECT_FALSE(threw) << "a refused update falls back to re-instantiation";
      EXPECT_EQ(ex.stats().graph_reinstantiations, fired);
    } else {
      EXPECT_EQ(threw, fired > 0) << "skip " << skip;
    }
    const bool moved = ex.config().layers[0].k_cache == nk[0].data();
    if (!threw) EXPECT_TRUE(moved);
    if (moved) {
      std::swap(rig.k_caches, nk);  // the reference reads the caches in effect
      std::swap(rig.v_caches, nv);
    }
    for (auto [lo, hi] : bands) {
      const Inputs in = rig.random_inputs(3, lo, hi);
      ex.step(in.view());
      EXPECT_TRUE(rig.check_step(ex, in)) << fault::to_string(site) << " skip " << skip << (moved ? " (new caches)" : " (old caches)");
    }
    EXPECT_LE(ex.stats().total_captures, graphs + (threw && moved ? graphs : 0));
    if (!threw) EXPECT_EQ(ex.stats().total_captures, graphs) << "a graph was captured anew after a rebind";
    if (fired == 0) break;
    ++failures;
  }
  if (site == Site::kCaptureBegin || site == Site::kCaptureEnd || site == Site::kMemcpy || site == Site::kGraphUpdate)
    EXPECT_GT(fired_total, 0) << fault::to_string(site) << " never reached by rebind_layers";
  ::testing::Test::RecordProperty("rebind_failures", failures);
}

INSTANTIATE_TEST_SUITE_P(Sites, HostFault, ::testing::ValuesIn(kAllSites), site_name);

// ---------------------------------------------------------------- the same on a GPU

#if DECODEGRAPH_HAS_CUDA
#define DG_CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x
#endif

class GpuFault : public ::testing::TestWithParam<Site> {};

TEST_P(GpuFault, DuringLazyCaptureAndReplay) {
  DG_REQUIRE_GPU();
#if DECODEGRAPH_HAS_CUDA
  Disarm guard;
  const Site site = GetParam();
  Rig rig(DType::kBFloat16, KVLayout::kVLLM);
  rig.cfg.backend = BackendKind::kCuda;
  std::vector<void*> dev;
  for (int l = 0; l < rig.cfg.num_layers; ++l) {
    void *k = nullptr, *v = nullptr;
    DG_CUDA_OK(cudaMalloc(&k, rig.cache_bytes()));
    DG_CUDA_OK(cudaMalloc(&v, rig.cache_bytes()));
    dev.push_back(k);
    dev.push_back(v);
    DG_CUDA_OK(cudaMemcpy(k, rig.k_caches[l].data(), rig.cache_bytes(), cudaMemcpyHostToDevice));
    DG_CUDA_OK(cudaMemcpy(v, rig.v_caches[l].data(), rig.cache_bytes(), cudaMemcpyHostToDevice));
    rig.cfg.layers[l].k_cache = k;
    rig.cfg.layers[l].v_cache = v;
  }
  {
    Executor ex(rig.cfg);
    const MemoryReport mem0 = ex.memory();
    const std::size_t qb = rig.cfg.max_batch * rig.row_elems() * dtype_size(rig.cfg.spec.dtype);
    const std::size_t kvb = rig.cfg.max_batch * rig.kv_row_elems() * dtype_size(rig.cfg.spec.dtype);
    std::vector<std::vector<unsigned char>> q(2, std::vector<unsigned char>(qb)), out = q;
    std::vector<std::vector<unsigned char>> nk(2, std::vector<unsigned char>(kvb)), nv = nk;
    for (int l = 0; l < 2; ++l) {
      dgtest::fill_uniform(rig.cfg.spec.dtype, q[l].data(), qb / 2, rig.rng);
      dgtest::fill_uniform(rig.cfg.spec.dtype, nk[l].data(), kvb / 2, rig.rng);
      dgtest::fill_uniform(rig.cfg.spec.dtype, nv[l].data(), kvb / 2, rig.rng);
      DG_CUDA_OK(cudaMemcpy(ex.query(l), q[l].data(), qb, cudaMemcpyHostToDevice));
      DG_CUDA_OK(cudaMemcpy(ex.new_key(l), nk[l].data(), kvb, cudaMemcpyHostToDevice));
      DG_CUDA_OK(cudaMemcpy(ex.new_value(l), nv[l].data(), kvb, cudaMemcpyHostToDevice));
    }
    DG_CUDA_OK(cudaDeviceSynchronize());  // a pageable cudaMemcpy may return before the DMA lands
    for (int attempt = 0; attempt < 2; ++attempt) {  // 0: capture step, 1: replay step
      fault::arm(site, 0, 1);
      const Inputs bad = rig.random_inputs(3, 1, 1024);
      bool threw = false;
      try {
        ex.step(bad.view());
      } catch (const Error& e) {
        threw = true;
        EXPECT_NE(std::string(e.what()).find(fault::to_string(site)), std::string::npos) << e.what();
      }
      EXPECT_EQ(threw, fault::fired(site) > 0);
      fault::disarm_all();
      DG_CUDA_OK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(ex.stream())));
      if (threw && kCaptureSites.count(site)) EXPECT_EQ(ex.stats().total_captures, attempt == 0 ? 0 : 1);
      EXPECT_EQ(ex.memory().static_buffers, mem0.static_buffers);
      EXPECT_EQ(ex.memory().workspace, mem0.workspace);
      const Inputs good = rig.random_inputs(3, 1, 1024);
      ex.step(good.view());
      DG_CUDA_OK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(ex.stream())));
      Rig::Views views;
      for (int l = 0; l < 2; ++l) {
        DG_CUDA_OK(cudaMemcpy(out[l].data(), ex.output(l), qb, cudaMemcpyDeviceToHost));
        DG_CUDA_OK(cudaMemcpy(rig.k_caches[l].data(), dev[2 * l], rig.cache_bytes(), cudaMemcpyDeviceToHost));
        DG_CUDA_OK(cudaMemcpy(rig.v_caches[l].data(), dev[2 * l + 1], rig.cache_bytes(),
                              cudaMemcpyDeviceToHost));
        views.q.push_back(q[l].data());
        views.out.push_back(out[l].data());
        views.new_key.push_back(nk[l].data());
        views.new_value.push_back(nv[l].data());
      }
      EXPECT_TRUE(rig.check_step(views, good));
    }
  }
  for (void* p : dev) cudaFree(p);
#endif
}

INSTANTIATE_TEST_SUITE_P(Sites, GpuFault, ::testing::ValuesIn(kAllSites), site_name);

}  // namespace
}  // namespace dgrel
