// Per-step records and the per-band table built from them, in its three forms: the text table, the
// CSV (--csv) and the JSON "bands". Every column is one entry of band_columns() in bands.cpp: a
// column added there appears in all three.
#pragma once

#include <string>
#include <vector>

#include "json_out.hpp"

namespace dgloop {

/// The planner's predictions (BucketPlan::predicted_lo / _mid / _hi) of the plan `layers` layers of
/// one step launch: one layer group's, counted once per layer of the group in the run.
struct ModelPoints {
  int layers = 0;
  dg::PlanPrediction lo, mid, hi;
};

/// The cost model's microseconds of one attention call at `len` tokens per sequence, linearly
/// interpolated between the plan's three predictions (lo-mid below mid.len, mid-hi above); outside
/// [lo.len, hi.len] the nearest end's value (the model is only evaluated at those three lengths). A
/// windowed group's points are at min(L, W), so holding the ends reads it at min(len, W) too.
/// `field`: which part of the prediction (us, or one term of its breakdown: loop_us, fixed_us,
/// merge_us, launch_us), interpolated the same way.
double interpolate_prediction(const ModelPoints& m, double len, double dg::PlanPrediction::*field = &dg::PlanPrediction::us);
/// Every layer's attention of one step at `len` tokens per sequence: the sum of layers x
/// interpolate_prediction over `model`.
double predicted_step_us(const std::vector<ModelPoints>& model, double len,
                         double dg::PlanPrediction::*field = &dg::PlanPrediction::us);

/// One step of the loop: what the executor chose and reported, and both timings.
struct StepRecord {
  int segment = 0;
  int step = 0;
  int band = 0;
  int band_lo = 0, band_hi = 0;
  dg::KernelKind kernel = dg::KernelKind::kV1;
  int partition_size = 0;
  bool captured = false;
  bool measured = false;  // the step timed kMeasured's candidates
  int graph_id = -1;
  int q_len = 1;     // n: query tokens per sequence
  int max_len = 0;
  double mean_len = 0;  // tokens per sequence, averaged over the batch
  std::vector<ModelPoints> model;  // the step's plans' predictions, per layer group
  double bytes = 0;  // bytes model, all layers
  double kv_bytes = 0;  // its K and V part (the cache read once for all n rows), all layers
  double kv_bytes_n1 = 0;  // the same of a step of n = 1 at the same lengths (a window reads W, not W + n - 1)
  long long tokens = 0;  // tokens the step generated: per sequence its accepted drafts + 1
  double eager_us = 0;
  double graph_us = 0;
  double max_abs_diff = 0;
  bool bitwise_equal = true;
};

/// The steps of one (band, kernel, partition size), summarised.
struct BandRow {
  int band = 0, band_lo = 0, band_hi = 0;
  int q_len = 1;
  dg::KernelKind kernel = dg::KernelKind::kV1;
  int partition_size = 0;
  int steps = 0;           // all steps in the band
  int timed_steps = 0;     // graph steps that replayed without capturing
  double eager_p50 = 0, eager_p99 = 0, graph_p50 = 0, graph_p99 = 0;
  double speedup = 0;      // eager p50 / graph p50
  double bytes_per_step = 0;
  double gbs = 0;          // bytes_per_step / graph p50
  double pct_read_bw = -1; // -1: n/a
  double pct_copy_bw = -1; // of the d2d copy bandwidth (read + write); -1: n/a
  double max_abs_diff = 0;
  /// The model's per-step figure: predicted_step_us at predicted_len, the mean of mean_len over the
  /// steps graph p50 is over (all the row's steps where none replayed); -1: no prediction.
  double predicted_len = 0;
  double predicted_us = -1;
  /// predicted_us broken down (PlanPrediction's terms, interpolated the same way; they add up to it):
  /// pass 1's main loop, its blocks' fixed phases, the merge, the launch gaps and kernel floors.
  double predicted_loop_us = 0, predicted_fixed_us = 0, predicted_merge_us = 0, predicted_launch_us = 0;
  double graph_over_predicted = -1;  // graph p50 / predicted_us; -1: n/a
};

/// Groups the steps by (band, q_len, kernel, partition size), in that order; bandwidths <= 0 leave the percentages n/a.
std::vector<BandRow> band_rows(const std::vector<StepRecord>& recs, double read_bw_gbs, double copy_bw_gbs);

/// "(lo, hi]"
std::string band_label(int lo, int hi);

/// The per-band section of the text output: title, table and the notes under it.
std::string band_report(const std::vector<BandRow>& rows, int batch, int layers, bool gpu);
/// --csv: a header line and one line per band.
std::string band_csv(const std::vector<BandRow>& rows);
json bands_json(const std::vector<BandRow>& rows);

/// Per n of the run: KV bytes read per generated token by the bytes model, against n = 1 at the same
/// lengths (every step reads the KV once, for its n rows; n = 1 generates one token per sequence and
/// step, n generates accepted + 1).
struct VerifyRow {
  int q_len = 1;
  int steps = 0;
  long long tokens = 0;      // generated
  long long seq_steps = 0;   // steps x sequences
  double kv_bytes = 0;       // all steps, all layers
  double kv_bytes_n1 = 0;    // steps of n = 1 at the same lengths
  double kv_per_token() const { return tokens > 0 ? kv_bytes / static_cast<double>(tokens) : 0; }
  /// n = 1 at the same lengths: one token per sequence and step.
  double kv_per_token_n1() const { return seq_steps > 0 ? kv_bytes_n1 / static_cast<double>(seq_steps) : 0; }
  double tokens_per_seq_step() const { return seq_steps > 0 ? static_cast<double>(tokens) / seq_steps : 0; }
};
std::vector<VerifyRow> verify_rows(const std::vector<StepRecord>& recs, int batch);
/// The "bytes model: KV read per generated token" line(s); empty when every step has n = 1.
std::string verify_report(const std::vector<VerifyRow>& rows);
json verify_json(const std::vector<VerifyRow>& rows);

}  // namespace dgloop
