// Memory: the executor's MemoryReport against sizes computed from the plan and the config, and the
// configured budget enforced at construction (never as an out-of-memory inside a step).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "rel_util.hpp"

namespace dgrel {
namespace {

// Staged buffers and executor-owned layer buffers, exactly, before any alignment padding.
std::size_t static_lower_bound(const Rig& rig, bool owns_q_out) {
  const ExecutorConfig& c = rig.cfg;
  const std::size_t es = dtype_size(c.spec.dtype);
  std::size_t b = c.max_batch * sizeof(int32_t)                                  // seq_lens
                  + static_cast<std::size_t>(c.max_batch) * c.max_blocks_per_seq * sizeof(int32_t)
                  + c.max_batch * sizeof(int64_t);                               // slot_mapping
  for (int l = 0; l < c.num_layers; ++l) {
    if (owns_q_out) b += 2 * c.max_batch * rig.row_elems() * es;                // q, out
    b += 2 * c.max_batch * rig.kv_row_elems() * es;                             // new K, new V
  }
  b += c.alibi_slopes.size() * sizeof(float);
  return b;
}
// Each buffer may be padded to an allocation granule; 512 bytes per buffer is a generous bound.
std::size_t static_slack(const Rig& rig) { return 512 * (4 + 4 * rig.cfg.num_layers); }

TEST(Memory, ReportMatchesPlanAndConfig) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Rig rig(dt, KVLayout::kVLLM, 3, 24, 2048);
    rig.cfg.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    Executor ex(rig.cfg);
    const MemoryReport m = ex.memory();
    std::size_t largest = 0;
    int v2_plans = 0;
    for (const BucketPlan& p : ex.plans()) {
      if (p.kernel == KernelKind::kV2) {
        ++v2_plans;
        EXPECT_EQ(p.workspace_bytes, v2_workspace_size(rig.cfg.spec, p.batch, p.band_hi, p.partition_size))
            << "bucket " << p.batch << " band " << p.band;
        largest = std::max(largest, p.workspace_bytes);
      } else {
        EXPECT_EQ(p.workspace_bytes, 0u) << "V1 bucket " << p.batch << " band " << p.band;
      }
    }
    EXPECT_GT(v2_plans, 0);
    EXPECT_EQ(m.workspace, largest) << "workspace must be sized for the largest plan";
    const std::size_t lo = static_lower_bound(rig, true);
    EXPECT_GE(m.static_buffers, lo);
    EXPECT_LE(m.static_buffers, lo + static_slack(rig));
    EXPECT_EQ(m.graphs, 0u) << "the host backend has no driver graph memory";
    EXPECT_EQ(m.total(), m.static_buffers + m.workspace + m.graphs);

    // Steady state: steps and captures do not change the accounting on host.
    rig.fill_step_buffers(ex);
    for (int i = 0; i < 5; ++i) {
      const Inputs in = rig.random_inputs(1 + i * 5, 1, 2048);
      ex.step(in.view());
      ASSERT_TRUE(rig.check_step(ex, in));
    }
    EXPECT_EQ(ex.memory().total(), m.total());
  }
}

TEST(Memory, CallerBuffersAreNotCounted) {
  Rig rig(DType::kFloat32, KVLayout::kNHD, 2, 8, 1024);
  const std::size_t owned = Executor(rig.cfg).memory().static_buffers;
  const std::size_t bytes = rig.cfg.max_batch * rig.row_elems() * sizeof(float);
  std::vector<std::vector<float>> q(2, std::vector<float>(bytes / 4)), out = q;
  for (int l = 0; l < 2; ++l) {
    rig.cfg.layers[l].q = q[l].data();
    rig.cfg.layers[l].out = out[l].data();
  }
  Executor ex(rig.cfg);
  const std::size_t shared = ex.memory().static_buffers;
  EXPECT_GE(owned - shared, 2 * 2 * bytes);
  EXPECT_LE(owned - shared, 2 * 2 * bytes + 4 * 512);
  EXPECT_GE(shared, static_lower_bound(rig, false));
  EXPECT_EQ(ex.query(0), q[0].data());
  EXPECT_EQ(ex.output(1), out[1].data());
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(5, 1, 1024);
  ex.step(in.view());
  EXPECT_TRUE(rig.check_step(ex, in));
}

TEST(Memory, BudgetEnforcedAtConfiguration) {
  Rig rig(DType::kBFloat16, KVLayout::kVLLM, 2, 16, 2048);
  rig.cfg.capture = CapturePolicy::kUpFront;
  const std::size_t need = Executor(rig.cfg).memory().total();
  ASSERT_GT(need, 0u);

  for (std::size_t budget : {need - 1, need / 2, std::size_t{1}}) {
    ExecutorConfig c = rig.cfg;
    c.memory_budget_bytes = budget;
    const std::string msg = error_of([&] { Executor ex(c); });
    EXPECT_TRUE(names(msg, {"memory_budget_bytes", std::to_string(budget)})) << msg;
    EXPECT_NE(msg.find(std::to_string(need)), std::string::npos)
        << "the message should say how much is needed (" << need << "): " << msg;
  }
  // Lazy capture is checked at configuration too: the plan is known before any step.
  ExecutorConfig lazy = rig.cfg;
  lazy.capture = CapturePolicy::kLazy;
  lazy.memory_budget_bytes = need - 1;
  EXPECT_TRUE(names(error_of([&] { Executor ex(lazy); }), {"memory_budget_bytes"}));

  // Exactly enough: every bucket of every band runs without an out-of-memory.
  rig.cfg.memory_budget_bytes = need;
  Executor ex(rig.cfg);
  EXPECT_LE(ex.memory().total(), need);
  rig.fill_step_buffers(ex);
  for (int n : {1, 16}) {
    for (int max_len : {100, 2048}) {
      const Inputs in = rig.random_inputs(n, max_len / 2, max_len);
      ex.step(in.view());
      ASSERT_TRUE(rig.check_step(ex, in));
    }
  }
  EXPECT_LE(ex.memory().total(), need);
}

TEST(Memory, SmallerBudgetFitsWhenV2IsNotPlanned) {
  // Raising the threshold to max_seq_len removes V2 plans and with them the workspace.
  Rig rig(DType::kFloat32, KVLayout::kVLLM, 1, 8, 1024);
  const MemoryReport with_v2 = Executor(rig.cfg).memory();
  rig.cfg.v2_threshold = 1024;
  rig.cfg.band_edges = {256, 1024};
  const MemoryReport v1_only = Executor(rig.cfg).memory();
  EXPECT_EQ(v1_only.workspace, 0u);
  EXPECT_GT(with_v2.workspace, 0u);
  rig.cfg.memory_budget_bytes = v1_only.total();
  EXPECT_LT(rig.cfg.memory_budget_bytes, with_v2.total());
  Executor ex(rig.cfg);
  rig.fill_step_buffers(ex);
  const Inputs in = rig.random_inputs(8, 900, 1024);
  EXPECT_EQ(ex.step(in.view()).kernel, KernelKind::kV1);
  EXPECT_TRUE(rig.check_step(ex, in));
}

}  // namespace
}  // namespace dgrel
