// decode_loop: the decode-loop benchmark, and the first program a new user runs.
//
// It allocates paged KV caches (random data) and block tables, then simulates a decode loop: every
// step each sequence grows by one token, a new block is appended to its block table when the token
// starts one, and the token's slot goes into slot_mapping. With --q-len / --q-lens it is a
// speculative verify loop: each step brings n tokens per sequence (slot_mapping [batch, n]) and each
// sequence accepts a random 0..n-1 of its drafts, growing by 1..n. Each step replays through the Executor
// (append the new K/V, then attention, for every layer) and runs again eagerly (CUDA: the eager
// launchers; host backend: the host:: implementation) on the same inputs; the outputs must agree
// (bitwise on a GPU, within tolerance on the host backend), otherwise the program exits non-zero.
//
// The run is split into segments, one per --start-lens entry ("N" or "MIN:MAX" spread over the
// batch); each runs --steps steps from its start lengths. Segments that start just below a band edge
// walk across it, so one run shows several bands and the V1 -> V2 swap at the threshold.
//
// Output: the device model and the plan table, the per-band table (eager vs graph latency, GB/s by
// the bytes model of docs/design.md, % of the read bandwidth measured in the same run), kAuto's and
// kThreshold's choice per band side by side, capture statistics; --json / --csv. --policy picks the
// executor's KernelPolicy; --plan-only prints (and --json writes) the plans without running a step
// (docs/planning.md). Options are parsed by CLI11, output formatted by fmt, and the JSON written with
// nlohmann::json.
//
// The files, in the order a run uses them; each depends only on those above it:
//   options          the command line (CLI11): a new option goes here
//   setup            what the options mean: the backend's defaults (a table), the preset (the table in
//                    bench_common.cpp) with the shape overrides, segments, sizes, the planning config
//   backend          memory, copies and fills in the backend's space; the machine's name and bandwidth
//   json_out         the JSON pieces both modes share
//   capture_compare  the capture cost of kHost against kDevice (the run's and --plan-only's)
//   policies         kAuto against kThreshold per band
//   plan_only        --plan-only
//   bands            per-step records and the per-band table: a column is one entry of band_columns()
//                    and appears in the text table, the CSV and the JSON; KV bytes per generated token
//   check            eager against graph, graph against the float64 reference
//   progress         the progress bar
//   run_loop         the caches and the loop: a segment's block tables, one step, its eager twin
//   report           the header, the executor's plan, captures and memory; the run's JSON document
//   main             (this file) the order of the whole: parse, resolve, plan-only or run, report
#include <fmt/format.h>

#include <cstdio>

#include "plan_only.hpp"
#include "report.hpp"

namespace dgloop {
namespace {

/// The run: header, caches, executor, loop, then the report in the order it is printed.
int run_and_report(const Setup& s, std::FILE* out) {
  fmt::print(out, "decodegraph {} decode_loop\n", dg::version());
  const Machine machine = measure_machine(s.gpu);
  fmt::print(out, "{}{}", machine_report(machine, s.gpu), run_header(s));

  Caches caches(s);
  const dg::ExecutorConfig cfg = run_config(s, caches);
  dg::Executor ex(cfg);
  fmt::print(out, "{}", executor_report(s, ex));
  dg::ExecutorConfig model_cfg = cfg;  // kAuto and kThreshold side by side, on the executor's device model
  model_cfg.device_model = ex.config().device_model;
  const std::vector<PolicyRow> policy_rows = compare_policies(model_cfg, s.opt.batch);

  const LoopResults loop = run_loop(s, ex, caches);

  const std::vector<BandRow> rows =
      band_rows(loop.recs, s.gpu ? machine.read.median_gbs : 0, s.gpu ? machine.copy.median_gbs : 0);
  fmt::print(out, "{}", band_report(rows, s.opt.batch, s.opt.layers, s.gpu));
  const std::vector<VerifyRow> verify = verify_rows(loop.recs, s.opt.batch);
  fmt::print(out, "{}", verify_report(verify));
  fmt::print(out, "{}",
             policies_report(policy_rows, s.opt.batch, model_cfg.device_model, s.opt.policy, s.opt.threshold));
  if (s.opt.csv) fmt::print("{}", band_csv(rows));
  const dg::ExecutorStats stats = ex.stats();
  const dg::MemoryReport mem = ex.memory();
  fmt::print(out, "{}", captures_report(s, stats, mem, loop.capture_wall_ms));
  // Capture cost of the two band choices side by side: every bucket captured up front by one more
  // executor each, on the same caches. kMeasured would time every candidate of every bucket first.
  const std::vector<CaptureCost> costs =
      cfg.policy == dg::KernelPolicy::kMeasured ? std::vector<CaptureCost>{} : capture_costs(cfg);
  fmt::print(out, "{}", run_capture_report(costs, s.gpu));
  const StepTotals totals = step_totals(loop.recs);
  fmt::print(out, "{}", check_report(loop.check, totals, loop.recs.size(), s.opt.layers, s.opt.check, s.gpu,
                                     tolerance_for(s.spec.dtype)));
  fmt::print(out, "wall time of the loop: {:.1f} s\n", loop.run_s);

  if (!s.opt.json_path.empty()) {
    write_json(s.opt.json_path, run_json({s, machine, ex, policy_rows, rows, verify, stats, mem, costs, loop, totals}));
    fmt::print(out, "json: {}\n", s.opt.json_path);
  }
  if (loop.check.mismatch_steps > 0 || loop.check.ref_failed || !loop.check.append_failure.empty()) {
    fmt::print(stderr, "\nFAILED: {} layer-steps where eager and graph outputs disagree{}{}\n",
               loop.check.mismatch_steps,
               loop.check.ref_failed ? "; graph output out of tolerance against the float64 reference" : "",
               loop.check.append_failure.empty() ? "" : "; a token's K/V not at its position: " + loop.check.append_failure);
    for (const auto& m : loop.check.mismatches) fmt::print(stderr, "  {}\n", m);
    return 1;
  }
  return 0;
}

int run(int argc, char** argv) {
  Options opt;
  if (const std::optional<int> status = parse_options(argc, argv, opt)) return *status;
  std::FILE* out = opt.csv ? stderr : stdout;  // with --csv, stdout carries only the CSV table
  const Setup s = resolve(std::move(opt));
  return s.opt.plan_only ? plan_only(s, out) : run_and_report(s, out);
}

}  // namespace
}  // namespace dgloop

int main(int argc, char** argv) {
  namespace dg = decodegraph;
  try {
    return dgloop::run(argc, argv);
  } catch (const dgloop::UsageError& e) {
    fmt::print(stderr, "decode_loop: {}\n(run decode_loop --help for the options)\n", e.what());
    return 2;
  } catch (const dg::Error& e) {
    fmt::print(stderr, "decode_loop: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "decode_loop: unexpected error: {}\n", e.what());
    return 2;
  }
}
