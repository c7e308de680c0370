// Per-step records and the per-band table built from them, in its three forms: the text table, the
// CSV (--csv) and the JSON "bands". Every column is one entry of band_columns() in bands.cpp: a
// column added there appears in all three.
#pragma once

#include <string>
#include <vector>

#include "json_out.hpp"

namespace dgloop {

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
  int max_len = 0;
  double bytes = 0;  // bytes model, all layers
  double eager_us = 0;
  double graph_us = 0;
  double max_abs_diff = 0;
  bool bitwise_equal = true;
};

/// The steps of one (band, kernel, partition size), summarised.
struct BandRow {
  int band = 0, band_lo = 0, band_hi = 0;
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
};

/// Groups the steps by (band, kernel, partition size); bandwidths <= 0 leave the percentages n/a.
std::vector<BandRow> band_rows(const std::vector<StepRecord>& recs, double read_bw_gbs, double copy_bw_gbs);

/// "(lo, hi]"
std::string band_label(int lo, int hi);

/// The per-band section of the text output: title, table and the notes under it.
std::string band_report(const std::vector<BandRow>& rows, int batch, int layers, bool gpu);
/// --csv: a header line and one line per band.
std::string band_csv(const std::vector<BandRow>& rows);
json bands_json(const std::vector<BandRow>& rows);

}  // namespace dgloop
