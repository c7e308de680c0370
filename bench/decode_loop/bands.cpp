#include "bands.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "bench_common.hpp"

namespace dgloop {

double interpolate_prediction(const ModelPoints& m, double len, double dg::PlanPrediction::*field) {
  const dg::PlanPrediction* pts[3] = {&m.lo, &m.mid, &m.hi};
  if (len <= pts[0]->len) return pts[0]->*field;
  for (int i = 0; i < 2; ++i) {
    const dg::PlanPrediction& a = *pts[i];
    const dg::PlanPrediction& b = *pts[i + 1];
    if (len > b.len) continue;
    if (b.len == a.len) return b.*field;  // a one-length segment (a band of one or two lengths)
    return a.*field + (b.*field - a.*field) * (len - a.len) / (b.len - a.len);
  }
  return pts[2]->*field;
}

double predicted_step_us(const std::vector<ModelPoints>& model, double len, double dg::PlanPrediction::*field) {
  double us = 0;
  for (const ModelPoints& m : model) us += m.layers * interpolate_prediction(m, len, field);
  return us;
}

std::vector<BandRow> band_rows(const std::vector<StepRecord>& recs, double read_bw_gbs, double copy_bw_gbs) {
  std::map<std::tuple<int, int, int, int>, std::vector<const StepRecord*>> groups;
  for (const auto& r : recs) groups[{r.band, r.q_len, static_cast<int>(r.kernel), r.partition_size}].push_back(&r);
  std::vector<BandRow> rows;
  for (const auto& [key, g] : groups) {
    BandRow row;
    row.band = g.front()->band;
    row.q_len = g.front()->q_len;
    row.band_lo = g.front()->band_lo;
    row.band_hi = g.front()->band_hi;
    row.kernel = g.front()->kernel;
    row.partition_size = g.front()->partition_size;
    row.steps = static_cast<int>(g.size());
    std::vector<double> eager, graph;
    double bytes = 0, len_all = 0, len_timed = 0;
    for (const auto* r : g) {
      eager.push_back(r->eager_us);
      bytes += r->bytes;
      len_all += r->mean_len;
      row.max_abs_diff = std::max(row.max_abs_diff, r->max_abs_diff);
      // A capturing (or measuring) step times the capture, not a replay.
      if (!r->captured && !r->measured) {
        graph.push_back(r->graph_us);
        len_timed += r->mean_len;
      }
    }
    row.timed_steps = static_cast<int>(graph.size());
    // The model at the lengths graph p50 was measured at. The last step's plans: kMeasured's are
    // final once the bucket has been captured.
    row.predicted_len = graph.empty() ? len_all / static_cast<double>(g.size()) : len_timed / static_cast<double>(graph.size());
    if (!g.back()->model.empty()) {
      const std::vector<ModelPoints>& m = g.back()->model;
      row.predicted_us = predicted_step_us(m, row.predicted_len);
      row.predicted_loop_us = predicted_step_us(m, row.predicted_len, &dg::PlanPrediction::loop_us);
      row.predicted_fixed_us = predicted_step_us(m, row.predicted_len, &dg::PlanPrediction::fixed_us);
      row.predicted_merge_us = predicted_step_us(m, row.predicted_len, &dg::PlanPrediction::merge_us);
      row.predicted_launch_us = predicted_step_us(m, row.predicted_len, &dg::PlanPrediction::launch_us);
    }
    row.bytes_per_step = bytes / static_cast<double>(g.size());
    row.eager_p50 = dgbench::percentile(eager, 50);
    row.eager_p99 = dgbench::percentile(eager, 99);
    if (!graph.empty()) {
      row.graph_p50 = dgbench::percentile(graph, 50);
      row.graph_p99 = dgbench::percentile(graph, 99);
      row.speedup = row.graph_p50 > 0 ? row.eager_p50 / row.graph_p50 : 0;
      row.gbs = row.graph_p50 > 0 ? row.bytes_per_step / (row.graph_p50 * 1e-6) / 1e9 : 0;
      if (read_bw_gbs > 0) row.pct_read_bw = 100.0 * row.gbs / read_bw_gbs;
      if (copy_bw_gbs > 0) row.pct_copy_bw = 100.0 * row.gbs / copy_bw_gbs;
      if (row.predicted_us > 0) row.graph_over_predicted = row.graph_p50 / row.predicted_us;
    }
    rows.push_back(row);
  }
  return rows;
}

std::string band_label(int lo, int hi) { return fmt::format("({}, {}]", lo, hi); }

namespace {

// ---------------------------------------------------------------- the columns

using Cell = std::string (*)(const BandRow&);

/// One field of a band row. The text table, the CSV and the JSON list the fields in this order; a
/// form that leaves a field out has nullptr there (the text table shows band_lo and band_hi as one
/// "band" cell, steps and timed_steps as one "steps" cell).
struct BandColumn {
  const char* key;                     // JSON key; CSV header where `csv` is set
  json (*json_value)(const BandRow&);
  Cell csv;
  const char* text_header;
  Cell text;
};

bool timed(const BandRow& b) { return b.timed_steps > 0; }
/// A figure from the graph timings in the text table: "-" where no step replayed without capturing.
std::string when_timed(const BandRow& b, double v) { return timed(b) ? fmt::format("{:.1f}", v) : "-"; }
std::string pct_text(double v) { return v >= 0 ? fmt::format("{:.1f}%", v) : "n/a"; }
std::string pct_csv(double v) { return v >= 0 ? fmt::format("{:.2f}", v) : "n/a"; }
std::string us_csv(double v) { return fmt::format("{:.3f}", v); }

const std::vector<BandColumn>& band_columns() {
  static const std::vector<BandColumn> columns = {
      {"band", [](const BandRow& b) { return json(b.band); }, nullptr, nullptr, nullptr},
      {"band_lo", [](const BandRow& b) { return json(b.band_lo); },
       [](const BandRow& b) { return std::to_string(b.band_lo); }, "band",
       [](const BandRow& b) { return band_label(b.band_lo, b.band_hi); }},
      {"band_hi", [](const BandRow& b) { return json(b.band_hi); },
       [](const BandRow& b) { return std::to_string(b.band_hi); }, nullptr, nullptr},
      {"q_len", [](const BandRow& b) { return json(b.q_len); },
       [](const BandRow& b) { return std::to_string(b.q_len); }, "n",
       [](const BandRow& b) { return std::to_string(b.q_len); }},
      {"kernel", [](const BandRow& b) { return json(dg::to_string(b.kernel)); },
       [](const BandRow& b) { return std::string(dg::to_string(b.kernel)); }, "kernel",
       [](const BandRow& b) { return std::string(dg::to_string(b.kernel)); }},
      {"partition_size", [](const BandRow& b) { return json(b.partition_size); },
       [](const BandRow& b) { return std::to_string(b.partition_size); }, "P",
       [](const BandRow& b) {
         return b.kernel == dg::KernelKind::kV2 ? std::to_string(b.partition_size) : std::string("-");
       }},
      {"steps", [](const BandRow& b) { return json(b.steps); },
       [](const BandRow& b) { return std::to_string(b.steps); }, "steps",
       [](const BandRow& b) {
         return b.timed_steps == b.steps ? std::to_string(b.steps) : fmt::format("{} ({})", b.steps, b.timed_steps);
       }},
      {"timed_steps", [](const BandRow& b) { return json(b.timed_steps); },
       [](const BandRow& b) { return std::to_string(b.timed_steps); }, nullptr, nullptr},
      {"eager_p50_us", [](const BandRow& b) { return num_or_null(b.eager_p50); },
       [](const BandRow& b) { return us_csv(b.eager_p50); }, "eager p50 us",
       [](const BandRow& b) { return fmt::format("{:.1f}", b.eager_p50); }},
      {"eager_p99_us", [](const BandRow& b) { return num_or_null(b.eager_p99); },
       [](const BandRow& b) { return us_csv(b.eager_p99); }, "eager p99 us",
       [](const BandRow& b) { return fmt::format("{:.1f}", b.eager_p99); }},
      {"graph_p50_us", [](const BandRow& b) { return num_or_null(b.graph_p50, timed(b)); },
       [](const BandRow& b) { return us_csv(b.graph_p50); }, "graph p50 us",
       [](const BandRow& b) { return when_timed(b, b.graph_p50); }},
      {"graph_p99_us", [](const BandRow& b) { return num_or_null(b.graph_p99, timed(b)); },
       [](const BandRow& b) { return us_csv(b.graph_p99); }, "graph p99 us",
       [](const BandRow& b) { return when_timed(b, b.graph_p99); }},
      {"predicted_us", [](const BandRow& b) { return num_or_null(b.predicted_us, b.predicted_us >= 0); },
       [](const BandRow& b) { return b.predicted_us >= 0 ? us_csv(b.predicted_us) : std::string("n/a"); }, "model us",
       [](const BandRow& b) { return b.predicted_us >= 0 ? fmt::format("{:.1f}", b.predicted_us) : std::string("-"); }},
      // The model's breakdown: one text cell "loop/fixed/merge/launch", four JSON and CSV fields.
      {"predicted_loop_us", [](const BandRow& b) { return num_or_null(b.predicted_loop_us, b.predicted_us >= 0); },
       [](const BandRow& b) { return b.predicted_us >= 0 ? us_csv(b.predicted_loop_us) : std::string("n/a"); },
       "model loop/fixed/merge/launch",
       [](const BandRow& b) {
         return b.predicted_us >= 0 ? fmt::format("{:.1f}/{:.1f}/{:.1f}/{:.1f}", b.predicted_loop_us, b.predicted_fixed_us,
                                                  b.predicted_merge_us, b.predicted_launch_us)
                                    : std::string("-");
       }},
      {"predicted_fixed_us", [](const BandRow& b) { return num_or_null(b.predicted_fixed_us, b.predicted_us >= 0); },
       [](const BandRow& b) { return b.predicted_us >= 0 ? us_csv(b.predicted_fixed_us) : std::string("n/a"); }, nullptr,
       nullptr},
      {"predicted_merge_us", [](const BandRow& b) { return num_or_null(b.predicted_merge_us, b.predicted_us >= 0); },
       [](const BandRow& b) { return b.predicted_us >= 0 ? us_csv(b.predicted_merge_us) : std::string("n/a"); }, nullptr,
       nullptr},
      {"predicted_launch_us", [](const BandRow& b) { return num_or_null(b.predicted_launch_us, b.predicted_us >= 0); },
       [](const BandRow& b) { return b.predicted_us >= 0 ? us_csv(b.predicted_launch_us) : std::string("n/a"); }, nullptr,
       nullptr},
      {"predicted_len", [](const BandRow& b) { return num_or_null(b.predicted_len); },
       [](const BandRow& b) { return fmt::format("{:.1f}", b.predicted_len); }, nullptr, nullptr},
      {"graph_over_predicted",
       [](const BandRow& b) { return num_or_null(b.graph_over_predicted, b.graph_over_predicted >= 0); },
       [](const BandRow& b) { return b.graph_over_predicted >= 0 ? fmt::format("{:.4f}", b.graph_over_predicted) : std::string("n/a"); },
       "graph/model",
       [](const BandRow& b) { return b.graph_over_predicted >= 0 ? fmt::format("{:.2f}x", b.graph_over_predicted) : std::string("-"); }},
      {"speedup", [](const BandRow& b) { return num_or_null(b.speedup, timed(b)); },
       [](const BandRow& b) { return fmt::format("{:.4f}", b.speedup); }, "speedup",
       [](const BandRow& b) { return timed(b) ? fmt::format("{:.2f}x", b.speedup) : "-"; }},
      {"bytes_per_step", [](const BandRow& b) { return num_or_null(b.bytes_per_step); },
       [](const BandRow& b) { return fmt::format("{:.0f}", b.bytes_per_step); }, nullptr, nullptr},
      {"gbs", [](const BandRow& b) { return num_or_null(b.gbs); },
       [](const BandRow& b) { return fmt::format("{:.3f}", b.gbs); }, "GB/s",
       [](const BandRow& b) { return when_timed(b, b.gbs); }},
      {"pct_read_bw", [](const BandRow& b) { return num_or_null(b.pct_read_bw, b.pct_read_bw >= 0); },
       [](const BandRow& b) { return pct_csv(b.pct_read_bw); }, "% read bw",
       [](const BandRow& b) { return pct_text(b.pct_read_bw); }},
      {"pct_copy_bw", [](const BandRow& b) { return num_or_null(b.pct_copy_bw, b.pct_copy_bw >= 0); },
       [](const BandRow& b) { return pct_csv(b.pct_copy_bw); }, "% copy bw",
       [](const BandRow& b) { return pct_text(b.pct_copy_bw); }},
      {"max_abs_diff", [](const BandRow& b) { return num_or_null(b.max_abs_diff); }, nullptr, nullptr, nullptr},
  };
  return columns;
}

std::string band_table(const std::vector<BandRow>& rows) {
  // The n column only where some step has n > 1: a plain decode loop's table is unchanged.
  const bool n_column = std::any_of(rows.begin(), rows.end(), [](const BandRow& b) { return b.q_len > 1; });
  auto shown = [&](const BandColumn& c) { return c.text && (n_column || std::string(c.key) != "q_len"); };
  std::vector<std::vector<std::string>> table(1);
  for (const BandColumn& c : band_columns())
    if (shown(c)) table[0].push_back(c.text_header);
  for (const BandRow& b : rows) {
    std::vector<std::string>& cells = table.emplace_back();
    for (const BandColumn& c : band_columns())
      if (shown(c)) cells.push_back(c.text(b));
  }
  return dgbench::format_table(table);
}

}  // namespace

// ---------------------------------------------------------------- the three forms

std::string band_report(const std::vector<BandRow>& rows, int batch, int layers, bool gpu) {
  std::string s = fmt::format(
      "per band (batch bucket {}, {} layers; {}):\n", batch, layers,
      gpu ? "GPU wall-clock per step, host launch through device completion" : "CPU timings of the host backend");
  s += band_table(rows);
  s += "  steps \"N (M)\": M of N steps timed for graph; the others captured the bucket's graph or timed "
       "its candidates (see captures below).\n"
       "  GB/s = bytes per step by the bytes model of docs/design.md (K+V read, q, out, V2 partials) / graph "
       "p50.\n";
  s += "  model us = the planner's cost model for the step: the sum over layers of its layer group's plan's\n"
       "  one-call prediction (BucketPlan::predicted_lo/_mid/_hi), linearly interpolated in length between lo, mid\n"
       "  and hi at the mean length of the steps measured in the row; graph/model = graph p50 / model us.\n"
       "  model loop/fixed/merge/launch = model us broken down: pass 1's main loop, its blocks' fixed phases\n"
       "  (latency chain, instructions outside the loop), the V2 merge, kernel floors and launch gaps.\n";
  if (!gpu)
    s += "  graph/model means nothing on the host backend: its timings are CPU timings, the model's a GPU's.\n"
         "  % read bw, % copy bw: n/a on the host backend (no device bandwidth to compare with).\n";
  return s;
}

std::string band_csv(const std::vector<BandRow>& rows) {
  std::vector<std::string> header;
  for (const BandColumn& c : band_columns())
    if (c.csv) header.push_back(c.key);
  std::string s = fmt::format("{}\n", fmt::join(header, ","));
  for (const BandRow& b : rows) {
    std::vector<std::string> cells;
    for (const BandColumn& c : band_columns())
      if (c.csv) cells.push_back(c.csv(b));
    s += fmt::format("{}\n", fmt::join(cells, ","));
  }
  return s;
}

json bands_json(const std::vector<BandRow>& rows) {
  json a = json::array();
  for (const BandRow& b : rows) {
    json j;
    for (const BandColumn& c : band_columns()) j[c.key] = c.json_value(b);
    a.push_back(std::move(j));
  }
  return a;
}

// ---------------------------------------------------------------- KV bytes per generated token

std::vector<VerifyRow> verify_rows(const std::vector<StepRecord>& recs, int batch) {
  std::map<int, VerifyRow> by_n;
  for (const StepRecord& r : recs) {
    VerifyRow& v = by_n[r.q_len];
    v.q_len = r.q_len;
    v.steps += 1;
    v.tokens += r.tokens;
    v.seq_steps += batch;
    v.kv_bytes += r.kv_bytes;
    v.kv_bytes_n1 += r.kv_bytes_n1;
  }
  std::vector<VerifyRow> rows;
  for (const auto& [n, v] : by_n) rows.push_back(v);
  return rows;
}

std::string verify_report(const std::vector<VerifyRow>& rows) {
  std::string s;
  for (const VerifyRow& v : rows) {
    if (v.q_len == 1) continue;  // n = 1 is the baseline itself
    const double ratio = v.kv_per_token_n1() > 0 ? v.kv_per_token() / v.kv_per_token_n1() : 0;
    s += fmt::format("bytes model: n = {}: {} of K+V read per generated token ({} step{}, {:.2f} tokens per sequence "
                     "and step: accepted drafts + 1) against {} at n = 1 over the same lengths (1 token per "
                     "sequence and step): {:.2f}x; a step reads the KV once for its n rows\n",
                     v.q_len, dgbench::format_bytes(v.kv_per_token()), v.steps, v.steps == 1 ? "" : "s",
                     v.tokens_per_seq_step(),
                     dgbench::format_bytes(v.kv_per_token_n1()), ratio);
  }
  return s.empty() ? s : "\n" + s;
}

json verify_json(const std::vector<VerifyRow>& rows) {
  json a = json::array();
  for (const VerifyRow& v : rows)
    a.push_back({{"q_len", v.q_len},
                 {"steps", v.steps},
                 {"tokens", v.tokens},
                 {"tokens_per_seq_step", v.tokens_per_seq_step()},
                 {"kv_bytes", v.kv_bytes},
                 {"kv_bytes_per_token", num_or_null(v.kv_per_token(), v.tokens > 0)},
                 {"kv_bytes_per_token_n1", num_or_null(v.kv_per_token_n1(), v.seq_steps > 0)}});
  return a;
}

}  // namespace dgloop
