// The engine author's mistakes that kCheap cannot see on the host, reported at the next step() or
// check_errors() as a CorruptedStepReport naming the sequence (issue 24), on the host backend:
// a slot of position seq_len instead of seq_len - 1, seq_lens that do not count the new token, a
// slot past the cache, and a bad block id; the wrong slot is never written, the other sequences
// stay right; the same for a draft token of a q_len 4 step. Also: plan_for() of a step whose band
// the graph chose on the device, the graph and launch numbering of StepResult / GraphStats /
// BucketPlan, and the host backend's warning for caches without sizes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "decodegraph/error.hpp"
#include "exec_world.hpp"

namespace {
using namespace decodegraph;
using dgtest::World;

AttentionSpec spec(DType dtype = DType::kFloat32) {
  AttentionSpec s;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.head_size = 64;
  s.block_size = 16;
  s.dtype = dtype;
  s.layout = KVLayout::kVLLM;
  return s;
}

/// Runs fn, which must throw a CorruptedStepReport; returns it (a default-kind one if none was thrown).
template <class F>
CorruptedStepReport report_of(F&& fn) {
  try {
    fn();
  } catch (const CorruptedStepReport& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a CorruptedStepReport: " << e.what();
    return CorruptedStepReport("", CorruptedStepReport::Kind::kBadBlockId, -1, -1, false, -2, -2);
  }
  ADD_FAILURE() << "nothing thrown; expected a CorruptedStepReport";
  return CorruptedStepReport("", CorruptedStepReport::Kind::kBadBlockId, -1, -1, false, -2, -2);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// K cache bytes of one layer, to see which slots a step wrote.
std::vector<unsigned char> cache_bytes(const World& w, int l) {
  const auto* b = static_cast<const unsigned char*>(w.k[l].data());
  return std::vector<unsigned char>(b, b + w.k[l].bytes);
}

/// K cache elements of slot `slot` (all heads) differ between two snapshots.
bool slot_changed(const World& w, const std::vector<unsigned char>& a, const std::vector<unsigned char>& b,
                  int64_t slot) {
  const AttentionSpec& s = w.spec;
  const int x = math::vllm_x(static_cast<int>(dtype_size(s.dtype)));
  const std::size_t es = dtype_size(s.dtype);
  for (int h = 0; h < s.num_kv_heads; ++h)
    for (int d = 0; d < s.head_size; ++d) {
      const int64_t o = math::k_offset(s.layout, slot / s.block_size, h, static_cast<int>(slot % s.block_size), d,
                                       s.num_kv_heads, s.head_size, s.block_size, x);
      if (std::memcmp(a.data() + o * es, b.data() + o * es, es) != 0) return true;
    }
  return false;
}

enum class Mistake { kSlotOfPositionSeqLen, kSeqLensWithoutTheNewToken, kSlotPastTheCache };

struct Case {
  Mistake mistake;
  BandSelect band_select;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const char* m = info.param.mistake == Mistake::kSlotOfPositionSeqLen        ? "SlotOfPositionSeqLen"
                  : info.param.mistake == Mistake::kSeqLensWithoutTheNewToken ? "SeqLensWithoutTheNewToken"
                                                                              : "SlotPastTheCache";
  return std::string(m) + "_" + to_string(info.param.band_select);
}

class SlotReport : public ::testing::TestWithParam<Case> {};

// Step 1 carries the mistake for sequence 1 (of 3) and runs (kCheap does not read slots on the
// host); its append skips that slot, the other rows are right. The next step() throws the report,
// running nothing; submitted again, it runs and is right.
TEST_P(SlotReport, KCheapSkipsTheSlotAndTheNextStepNamesTheSequence) {
  const Case c = GetParam();
  World w(spec(), 2, 4, 1024, 241);
  ExecutorConfig cfg = w.config(4, 1024);
  cfg.validation = ValidationLevel::kCheap;
  cfg.band_select = c.band_select;
  Executor ex(cfg);
  w.set_lens({40, 33, 7});
  w.fill_step(ex);
  ex.step(w.inputs());  // a good step first
  ASSERT_TRUE(w.check_layer(ex, 0));
  ex.check_errors();  // step 1 was clean: a later report names exactly the step it came from

  w.set_lens({41, 34, 8});
  const int64_t good_slot = w.slots[1];
  int64_t wrong_slot = -1;
  switch (c.mistake) {
    case Mistake::kSlotOfPositionSeqLen:  // the slot of position 34 (seq_len) instead of 33
      wrong_slot = w.slots[1] = static_cast<int64_t>(w.seq_blocks[1][34 / 16]) * 16 + 34 % 16;
      break;
    case Mistake::kSeqLensWithoutTheNewToken:  // the slot is right, the length is one short
      w.lens[1] = 33;
      break;
    case Mistake::kSlotPastTheCache:
      wrong_slot = w.slots[1] = static_cast<int64_t>(w.num_blocks) * 16 + 5;
      break;
  }
  w.fill_step(ex);
  const std::vector<unsigned char> before = cache_bytes(w, 0);
  EXPECT_NO_THROW(ex.step(w.inputs())) << "kCheap runs the step";
  const std::vector<unsigned char> after = cache_bytes(w, 0);
  EXPECT_FALSE(slot_changed(w, before, after, good_slot)) << "the skipped token must not be written";
  if (wrong_slot >= 0 && wrong_slot < static_cast<int64_t>(w.num_blocks) * 16)
    EXPECT_FALSE(slot_changed(w, before, after, wrong_slot)) << "the wrong slot must not be written";
  EXPECT_TRUE(slot_changed(w, before, after, w.slots[0])) << "sequence 0's token is appended";
  EXPECT_TRUE(slot_changed(w, before, after, w.slots[2])) << "sequence 2's token is appended";
  const int n = 3;
  std::vector<double> ref = w.reference(0, ex.query(0));
  EXPECT_TRUE(dgtest::check_close(w.spec.dtype, ex.output(0), ref.data(), n, 8, 64, 2e-5, 1e-4,
                                  {true, false, true}))
      << "the other sequences are right";

  w.set_lens({42, 35, 9});
  w.fill_step(ex);
  const CorruptedStepReport r = report_of([&] { ex.step(w.inputs()); });
  const CorruptedStepReport::Kind want = c.mistake == Mistake::kSlotPastTheCache
                                             ? CorruptedStepReport::Kind::kSlotPastCache
                                             : CorruptedStepReport::Kind::kSlotMismatch;
  EXPECT_EQ(r.kind(), want);
  EXPECT_EQ(r.sequence(), 1);
  EXPECT_EQ(r.block_table_column(), -1);
  EXPECT_EQ(r.first_step(), 2);
  EXPECT_EQ(r.last_step(), 2);
  EXPECT_TRUE(r.step_refused());
  const std::string msg = r.what();
  for (const std::string part : {"inputs.slot_mapping[1]", "sequence 1", "step 2", "Re-prefill sequence 1",
                                 "submit its inputs again", "kCheap"})
    EXPECT_TRUE(contains(msg, part)) << "'" << part << "' not in: " << msg;
  EXPECT_EQ(ex.stats().rejected_steps, 1);
  EXPECT_EQ(ex.stats().bad_block_reports, 1);
  ex.step(w.inputs());  // submitted again, it runs
  EXPECT_NO_THROW(ex.check_errors());
  EXPECT_EQ(ex.stats().steps, 3);
}

INSTANTIATE_TEST_SUITE_P(Host, SlotReport,
                         ::testing::Values(Case{Mistake::kSlotOfPositionSeqLen, BandSelect::kDevice},
                                           Case{Mistake::kSlotOfPositionSeqLen, BandSelect::kHost},
                                           Case{Mistake::kSeqLensWithoutTheNewToken, BandSelect::kDevice},
                                           Case{Mistake::kSeqLensWithoutTheNewToken, BandSelect::kHost},
                                           Case{Mistake::kSlotPastTheCache, BandSelect::kDevice}),
                         case_name);

// check_errors() reports the same thing without refusing a step; kFull rejects the step up front.
TEST(SlotReport, CheckErrorsReportsItAndKFullRejectsItBeforeTheStep) {
  World w(spec(), 1, 4, 512, 251);
  ExecutorConfig cfg = w.config(4, 512);
  cfg.validation = ValidationLevel::kCheap;
  {
    Executor ex(cfg);
    w.set_lens({20, 100});
    w.slots[0] = static_cast<int64_t>(w.seq_blocks[0][1]) * 16 + 4;  // position 20 = seq_len
    w.fill_step(ex);
    ex.step(w.inputs());
    const CorruptedStepReport r = report_of([&] { ex.check_errors(); });
    EXPECT_EQ(r.kind(), CorruptedStepReport::Kind::kSlotMismatch);
    EXPECT_EQ(r.sequence(), 0);
    EXPECT_FALSE(r.step_refused());
    EXPECT_FALSE(contains(r.what(), "submit its inputs again")) << r.what();
    EXPECT_TRUE(contains(r.what(), "Re-prefill sequence 0")) << r.what();
    EXPECT_NO_THROW(ex.check_errors()) << "reported once";
    EXPECT_EQ(ex.stats().rejected_steps, 0);
  }
  cfg.validation = ValidationLevel::kFull;
  Executor ex(cfg);
  w.fill_step(ex);
  dgtest::expect_error([&] { ex.step(w.inputs()); },
                       {"inputs.slot_mapping[0]", "the slot of position seq_len - 1 = 19"});
  EXPECT_EQ(ex.stats().steps, 0);
}

// q_len > 1 (speculative steps, q_lens {1, 4}) under the default kCheap: the append checks every
// token against its own position seq_len - q_len + j (AppendArgs::tokens_per_seq), so a wrong slot
// at a draft token (j = 2 of sequence 1) is skipped, the sequence's other tokens and the other
// sequences are appended, and the next step() names the entry, its sequence and its token. The
// wrong slot is the slot of position seq_len (one past the step's last token) or a slot of
// sequence 0's history; neither is written. Submitted again, the step runs, and so does a q_len 1
// step after it.
enum class DraftMistake { kSlotOfPositionSeqLen, kAnotherSequencesSlot };

struct DraftCase {
  DraftMistake mistake;
  BandSelect band_select;
};

class DraftSlotReport : public ::testing::TestWithParam<DraftCase> {};

TEST_P(DraftSlotReport, KCheapSkipsADraftTokensWrongSlotAndTheNextStepNamesIt) {
  const DraftCase c = GetParam();
  World w(spec(), 2, 4, 1024, 269);
  ExecutorConfig cfg = w.config(4, 1024);
  cfg.q_lens = {1, 4};
  ASSERT_EQ(ExecutorConfig{}.validation, ValidationLevel::kCheap) << "the default level";
  cfg.validation = ValidationLevel::kCheap;  // World::config asks for kFull
  cfg.band_select = c.band_select;
  Executor ex(cfg);
  w.set_lens({40, 33, 7}, 4);
  w.fill_step(ex);
  ex.step(w.inputs());  // a good step first
  ASSERT_TRUE(w.check_layer(ex, 0));
  ASSERT_TRUE(w.check_appended(ex, 0));
  ex.check_errors();

  w.set_lens({44, 37, 11}, 4);
  const int bad_t = 1 * 4 + 2;  // sequence 1, token 2: position 37 - 4 + 2 = 35
  const int64_t good_slot = w.slots[bad_t];
  ASSERT_EQ(good_slot, w.slot_of(1, 35));
  const int64_t wrong_slot = w.slots[bad_t] =
      c.mistake == DraftMistake::kSlotOfPositionSeqLen ? w.slot_of(1, 37) : w.slot_of(0, 10);
  w.fill_step(ex);
  const std::vector<unsigned char> before = cache_bytes(w, 0);
  EXPECT_NO_THROW(ex.step(w.inputs())) << "kCheap runs the step";
  const std::vector<unsigned char> after = cache_bytes(w, 0);
  EXPECT_FALSE(slot_changed(w, before, after, good_slot)) << "the skipped token must not be written";
  EXPECT_FALSE(slot_changed(w, before, after, wrong_slot)) << "the wrong slot must not be written";
  for (int t = 0; t < 12; ++t)
    if (t != bad_t) EXPECT_TRUE(slot_changed(w, before, after, w.slots[t])) << "token " << t << " is appended";
  std::vector<double> ref = w.reference(0, ex.query(0));
  // fp32 host attention against the float64 reference: fp32 sums over <= 44 tokens of O(1) terms,
  // a relative error of a few 44 x 2^-24 ~ 3e-6 at most; 1e-5 relative, 1e-6 near zero.
  EXPECT_TRUE(dgtest::check_close(w.spec.dtype, ex.output(0), ref.data(), 12, 8, 64, 1e-6, 1e-5,
                                  {true, true, true, true, false, false, false, false, true, true, true, true}))
      << "the other sequences are right";

  w.set_lens({45, 38, 12}, 1);
  w.fill_step(ex);
  const CorruptedStepReport r = report_of([&] { ex.step(w.inputs()); });
  EXPECT_EQ(r.kind(), CorruptedStepReport::Kind::kSlotMismatch);
  EXPECT_EQ(r.sequence(), 1);
  EXPECT_EQ(r.block_table_column(), -1);
  EXPECT_EQ(r.first_step(), 2);
  EXPECT_EQ(r.last_step(), 2);
  EXPECT_TRUE(r.step_refused());
  const std::string msg = r.what();
  for (const std::string part :
       {"slot_mismatch, sequence 1, step 2",
        "inputs.slot_mapping[6] (sequence 1, token 2 of q_len 4: position seq_len - q_len + 2 = seq_len - 2)",
        "was not the slot of position seq_len - q_len + 2 under its block-table row", "Re-prefill sequence 1",
        "submit its inputs again"})
    EXPECT_TRUE(contains(msg, part)) << "'" << part << "' not in: " << msg;
  EXPECT_EQ(ex.stats().rejected_steps, 1);
  EXPECT_EQ(ex.stats().bad_block_reports, 1);
  ex.step(w.inputs());  // submitted again, it runs
  EXPECT_NO_THROW(ex.check_errors());
  EXPECT_TRUE(w.check_appended(ex, 0));
  EXPECT_TRUE(w.check_layer(ex, 0));
  w.set_lens({49, 42, 16}, 4);  // and a q_len 4 step after it
  w.fill_step(ex);
  ex.step(w.inputs());
  EXPECT_NO_THROW(ex.check_errors());
  EXPECT_TRUE(w.check_appended(ex, 0));
  EXPECT_TRUE(w.check_layer(ex, 0));
  EXPECT_EQ(ex.stats().steps, 4);
}

INSTANTIATE_TEST_SUITE_P(Host, DraftSlotReport,
                         ::testing::Values(DraftCase{DraftMistake::kSlotOfPositionSeqLen, BandSelect::kDevice},
                                           DraftCase{DraftMistake::kSlotOfPositionSeqLen, BandSelect::kHost},
                                           DraftCase{DraftMistake::kAnotherSequencesSlot, BandSelect::kDevice}),
                         [](const ::testing::TestParamInfo<DraftCase>& info) {
                           return std::string(info.param.mistake == DraftMistake::kSlotOfPositionSeqLen
                                                  ? "SlotOfPositionSeqLen"
                                                  : "AnotherSequencesSlot") +
                                  "_" + to_string(info.param.band_select);
                         });

// The bad-block report is the same kind, with the table column.
TEST(BadBlockReport, IsACorruptedStepReportWithTheColumn) {
  World w(spec(), 1, 4, 1024, 257);
  ExecutorConfig cfg = w.config(4, 1024);
  cfg.validation = ValidationLevel::kCheap;
  Executor ex(cfg);
  w.set_lens({100, 300});
  w.tables[1 * w.stride + 7] = w.num_blocks + 1;
  w.fill_step(ex);
  ex.step(w.inputs());
  const CorruptedStepReport r = report_of([&] { ex.step(w.inputs()); });
  EXPECT_EQ(r.kind(), CorruptedStepReport::Kind::kBadBlockId);
  EXPECT_EQ(r.sequence(), 1);
  EXPECT_EQ(r.block_table_column(), 7);
  EXPECT_TRUE(contains(r.what(), "inputs.block_tables[1][7]")) << r.what();
  const InvalidArgument* base = &r;  // still an InvalidArgument for callers that catch only that
  EXPECT_NE(base, nullptr);
}

// ---------------------------------------------------------------- plan_for under kDevice

// Device-resident inputs under kDevice and kCheap: the graph picks the band, so the step's result
// has band -1. plan_for(result) says so and where the band is counted; plans_for(bucket) gives
// every band's plan. With host inputs the band (and its launch) is known.
TEST(PlanFor, KDeviceWithDeviceInputsNamesTheBucketsPlansAndTheBandCounters) {
  World w(spec(), 1, 4, 2048, 263);
  ExecutorConfig cfg = w.config(4, 2048);
  cfg.validation = ValidationLevel::kCheap;
  ASSERT_EQ(cfg.band_select, BandSelect::kDevice) << "the default";
  Executor ex(cfg);
  ASSERT_EQ(ex.band_select(), BandSelect::kDevice);
  w.set_lens({700, 20, 90});
  w.fill_step(ex);
  StepInputs in = w.inputs();
  in.space = MemorySpace::kDevice;  // host memory here, read as the device would
  const StepResult r = ex.step(in);
  ASSERT_EQ(r.band, -1);
  ASSERT_TRUE(r.band_on_device);
  EXPECT_EQ(r.launch_id, -1);
  EXPECT_EQ(r.graph_id, r.bucket.value);
  dgtest::expect_error([&] { ex.plan_for(r); },
                       {"step.band = -1", "chose its band on the device", "plans_for(step.bucket)", "band_replays"});
  const std::span<const BucketPlan> plans = ex.plans_for(r.bucket);
  ASSERT_EQ(plans.size(), ex.config().band_edges.size());
  for (std::size_t b = 0; b < plans.size(); ++b) {
    EXPECT_EQ(&plans[b], &ex.plan_for(r.bucket, static_cast<int>(b)));
    EXPECT_EQ(plans[b].batch, r.bucket_batch_size);
  }
  EXPECT_THROW(ex.plans_for(BucketIndex(99)), InvalidArgument);
  // The branch it ran is counted: band of 700 tokens is (512, 1024], band 1.
  const ExecutorStats st = ex.stats();
  ASSERT_EQ(st.graphs.size(), 1u);
  ASSERT_EQ(st.graphs[0].band_replays.size(), plans.size());
  EXPECT_EQ(st.graphs[0].band_replays[1], 1);
  EXPECT_TRUE(w.check_layer(ex, 0));

  // Host inputs: the band is known, and so is the launch.
  const StepResult h = ex.step(w.inputs());
  ASSERT_EQ(h.band, 1);
  EXPECT_EQ(&ex.plan_for(h), &plans[1]);
  EXPECT_EQ(h.launch_id, plans[1].graph_id);
}

// ---------------------------------------------------------------- graph and launch numbering

// StepResult::graph_id and GraphStats::graph_id name the graph (kHost: one per launch, kDevice: one
// per batch bucket); StepResult::launch_id, GraphStats::band_launch_ids and BucketPlan::graph_id
// name the launch, in both modes.
TEST(GraphIds, GraphsAndLaunchesAreNamedForWhatTheyCount) {
  for (BandSelect mode : {BandSelect::kHost, BandSelect::kDevice}) {
    SCOPED_TRACE(to_string(mode));
    World w(spec(), 1, 8, 4096, 269);
    ExecutorConfig cfg = w.config(8, 4096);
    cfg.band_select = mode;
    Executor ex(cfg);
    const std::vector<std::vector<int>> steps = {{100, 3}, {3000, 7, 9}, {600, 1, 2, 3, 4}, {100, 4}};
    std::vector<StepResult> results;
    for (const auto& lens : steps) {
      w.set_lens(lens);
      w.fill_step(ex);
      results.push_back(ex.step(w.inputs()));
    }
    const ExecutorStats st = ex.stats();
    for (const StepResult& r : results) {
      const BucketPlan& p = ex.plan_for(r);
      EXPECT_EQ(r.launch_id, p.graph_id);
      const GraphStats* g = nullptr;
      for (const GraphStats& gs : st.graphs)
        if (gs.graph_id == r.graph_id) g = &gs;
      ASSERT_NE(g, nullptr) << "graph " << r.graph_id << " not in stats().graphs";
      EXPECT_EQ(g->batch, r.bucket_batch_size);
      if (mode == BandSelect::kHost) {
        EXPECT_EQ(r.graph_id, r.launch_id);
        EXPECT_TRUE(g->band_launch_ids.empty());
      } else {
        EXPECT_EQ(r.graph_id, r.bucket.value);
        ASSERT_EQ(g->band_launch_ids.size(), ex.plans_for(r.bucket).size());
        EXPECT_EQ(g->band_launch_ids[static_cast<std::size_t>(r.band)], r.launch_id);
      }
    }
  }
}

// ---------------------------------------------------------------- cache sizes on the host backend

// The host backend cannot ask how large a cache is: without k_cache_bytes / v_cache_bytes a cache
// smaller than num_blocks blocks would be read and written out of bounds. It warns, once per
// executor; with the sizes, nothing.
TEST(CacheSizes, HostBackendWarnsOnceWhenTheSizesAreMissing) {
  World w(spec(), 2, 2, 256, 271);
  ExecutorConfig cfg = w.config(2, 256);
  cfg.log_level = "warn";
  ExecutorConfig unsized = cfg;
  unsized.layers[1].k_cache_bytes = 0;
  unsized.layers[1].v_cache_bytes = 0;

  ::testing::internal::CaptureStderr();
  { Executor ex(cfg); }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(contains(err, "k_cache_bytes")) << err;

  ::testing::internal::CaptureStderr();
  Executor ex(unsized);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "layers[1].k_cache_bytes / v_cache_bytes not given (1 of 2 layers")) << err;
  EXPECT_TRUE(contains(err, "out of bounds")) << err;
  EXPECT_EQ(err.find("not given ("), err.rfind("not given (")) << "warned more than once: " << err;

  ::testing::internal::CaptureStderr();
  ex.rebind_layers(unsized.layers);  // still missing: not warned again by this executor
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(contains(err, "not given")) << "warned twice by one executor: " << err;
}

}  // namespace
